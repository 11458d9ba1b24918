import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from '@jest/globals';

/** What `npm pack` would publish: the built library and its types, no tests, no sample. */
describe('published package', () => {
  const [pack] = JSON.parse(
    execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { encoding: 'utf8' }),
  );
  const files: string[] = pack.files.map((file: { path: string }) => file.path);
  const manifest = JSON.parse(readFileSync('package.json', 'utf8'));

  it('contains the entry points that exports and types name', () => {
    for (const entry of ['.', './testing']) {
      expect(files).toContain(manifest.exports[entry].default.replace('./', ''));
      expect(files).toContain(manifest.exports[entry].types.replace('./', ''));
    }
    expect(files).toContain(manifest.types.replace('./', ''));
  });

  it('contains the command that bin names', () => {
    expect(files).toContain(manifest.bin['nest-idempotent-webhooks'].replace('./', ''));
  });

  it('contains no tests, fixtures, sample or bench code', () => {
    expect(files.filter((file) => /(^|\/)(test|sample|bench)\//.test(file) || /spec\./.test(file))).toEqual(
      [],
    );
  });
});
