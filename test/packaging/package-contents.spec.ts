import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, relative, resolve } from 'node:path';
import { describe, expect, it } from '@jest/globals';

/**
 * What `npm pack` would publish: an ESM build (dist/lib) and a CommonJS build (dist/cjs), each
 * with its types and its maps, the licence, the readme and the changelog; no sources, tests,
 * sample or bench. Reads the built files, so `npm run build` must have run (`npm test` does).
 */
describe('published package', () => {
  const [pack] = JSON.parse(
    execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { encoding: 'utf8' }),
  );
  const files: string[] = pack.files.map((file: { path: string }) => file.path);
  const manifest = JSON.parse(readFileSync('package.json', 'utf8'));
  const shipped = (path: string) => path.replace(/^\.\//, '');

  /** Every entry point: the root, and the subpaths of what only some apps import. */
  const ENTRIES = ['.', './errors', './operator', './observability', './testing'];

  it('exports exactly these entry points, and package.json', () => {
    expect(Object.keys(manifest.exports).sort()).toEqual([...ENTRIES, './package.json'].sort());
  });

  it.each(ENTRIES)('%s has an import and a require entry, each with its types', (entry) => {
    const conditions = manifest.exports[entry];
    expect(Object.keys(conditions)).toEqual(['import', 'require']);
    expect(conditions.import.default).toMatch(/^\.\/dist\/lib\/.*\.js$/);
    expect(conditions.require.default).toMatch(/^\.\/dist\/cjs\/.*\.js$/);
    for (const condition of ['import', 'require']) {
      // "types" first: TypeScript takes the first condition it knows.
      expect(Object.keys(conditions[condition])).toEqual(['types', 'default']);
      expect(conditions[condition].types).toBe(conditions[condition].default.replace(/\.js$/, '.d.ts'));
      expect(files).toContain(shipped(conditions[condition].default));
      expect(files).toContain(shipped(conditions[condition].types));
    }
  });

  it('points main, types and typesVersions (resolvers without exports) at the CommonJS build', () => {
    expect(manifest.main).toBe(manifest.exports['.'].require.default);
    expect(manifest.types).toBe(manifest.exports['.'].require.types);
    const subpaths = ENTRIES.filter((entry) => entry !== '.');
    expect(manifest.typesVersions).toEqual({
      '*': Object.fromEntries(
        subpaths.map((entry) => [entry.slice(2), [manifest.exports[entry].require.types]]),
      ),
    });
    for (const path of [
      manifest.main,
      manifest.types,
      ...subpaths.map((entry) => manifest.exports[entry].require.types),
    ]) {
      expect(files).toContain(shipped(path));
    }
  });

  it('contains the command that bin names, an ES module with its shebang', () => {
    const command = manifest.bin['nest-idempotent-webhooks'];
    expect(command).toMatch(/^\.\/dist\/lib\//);
    expect(files).toContain(shipped(command));
    expect(readFileSync(command, 'utf8')).toMatch(/^#!\/usr\/bin\/env node\n/);
  });

  it('marks dist/cjs as CommonJS, inside a package that is ESM', () => {
    expect(manifest.type).toBe('module');
    expect(files).toContain('dist/cjs/package.json');
    expect(JSON.parse(readFileSync('dist/cjs/package.json', 'utf8'))).toEqual({ type: 'commonjs' });
  });

  it('ships the same modules in both builds, but for the command (ESM only)', () => {
    const modules = (build: string) =>
      files
        .filter((file) => file.startsWith(`dist/${build}/`) && /\.(js|d\.ts)$/.test(file))
        .map((file) => file.slice(`dist/${build}/`.length))
        .sort();
    expect(modules('lib').length).toBeGreaterThan(0);
    expect(modules('lib').filter((file) => file.startsWith('cli/')).length).toBeGreaterThan(0);
    expect(modules('cjs')).toEqual(modules('lib').filter((file) => !file.startsWith('cli/')));
  });

  it('contains the licence, the readme and the changelog', () => {
    expect(files).toEqual(expect.arrayContaining(['LICENSE', 'README.md', 'CHANGELOG.md']));
    expect(readFileSync('LICENSE', 'utf8')).toMatch(/^MIT License/);
    expect(manifest.license).toBe('MIT');
  });

  it('contains no sources, tests, fixtures, sample or bench code', () => {
    expect(files.filter((file) => /\.ts$/.test(file) && !/\.d\.ts$/.test(file))).toEqual([]);
    expect(
      files.filter((file) => /(^|\/)(test|sample|bench|scripts)\//.test(file) || /spec\./.test(file)),
    ).toEqual([]);
    expect(
      files.every((file) => /^(dist\/(lib|cjs)|observability)\//.test(file) || !file.includes('/')),
    ).toBe(true);
  });

  it('ships the Grafana dashboard and the Prometheus alert rules, and nothing else beside them', () => {
    expect(files.filter((file) => file.startsWith('observability/')).sort()).toEqual([
      'observability/grafana/idempotency-dashboard.json',
      'observability/prometheus/idempotency-alerts.rules.yml',
    ]);
  });

  it('gives every script a shipped map that carries its sources', () => {
    const scripts = files.filter((file) => file.endsWith('.js'));
    expect(scripts.length).toBeGreaterThan(0);
    for (const script of scripts) {
      const reference = /\/\/# sourceMappingURL=(.+)\s*$/.exec(readFileSync(script, 'utf8'))?.[1];
      expect({ script, reference }).toEqual({ script, reference: `${script.split('/').pop()}.map` });
      const map = JSON.parse(readFileSync(`${script}.map`, 'utf8'));
      expect(files).toContain(`${script}.map`);
      // Sources are named under lib/, which is not shipped: their text must be in the map.
      expect(map.sourcesContent).toHaveLength(map.sources.length);
      expect(map.sourcesContent.every((text: unknown) => typeof text === 'string' && text.length > 0)).toBe(
        true,
      );
      // ...and in this checkout they name the file the script was compiled from, in either build.
      for (const source of map.sources as string[]) {
        const path = relative(process.cwd(), resolve(dirname(script), source));
        expect(path).toBe(script.replace(/^dist\/(lib|cjs)\//, 'lib/').replace(/\.js$/, '.ts'));
        expect(existsSync(path)).toBe(true);
      }
    }
  });
});
