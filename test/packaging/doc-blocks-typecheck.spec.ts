import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { extractDocBlocks, inMarkdownTerms, writeDocBlocks } from '../support/doc-blocks.js';

const run = promisify(execFile);
const TSC = resolve('node_modules/typescript-native/bin/tsc');

/** Lines of a fixture Markdown file; `FENCE` keeps the fixtures' own fences out of this file's. */
const FENCE = '```';
const md = (...lines: string[]) => lines.join('\n') + '\n';

/**
 * The compiler half of the doc-block checks (the extraction half is test/unit/doc-blocks.spec.ts),
 * as the packaging tests use it, here against this checkout's own build (`npm test` builds first):
 * a folder inside the repository resolves `nest-idempotent-webhooks` to dist/ through the
 * package's own name, as an app resolves it in node_modules.
 */
describe('doc blocks: type-checked in Markdown terms', () => {
  let dir: string;

  beforeAll(async () => {
    await mkdir(resolve('.scratch'), { recursive: true });
    dir = await mkdtemp(resolve('.scratch/doc-blocks-'));
    const base = {
      compilerOptions: {
        module: 'nodenext',
        moduleResolution: 'nodenext',
        target: 'ES2022',
        experimentalDecorators: true,
        emitDecoratorMetadata: true,
        skipLibCheck: true,
        types: ['node'],
      },
    };
    await writeFile(join(dir, 'tsconfig.json'), JSON.stringify(base));
  });

  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  const check = async (markdown: string) => {
    const written = await writeDocBlocks(
      dir,
      extractDocBlocks(markdown, 'docs/fixture.md'),
      './tsconfig.json',
    );
    try {
      await run('node', [TSC, '-p', written.tsconfig], { cwd: dir });
      return { ok: true, output: '' };
    } catch (error) {
      const { stdout, stderr } = error as { stdout: string; stderr: string };
      return { ok: false, output: inMarkdownTerms(stdout + stderr, written) };
    }
  };

  // The README's old forRootAsync sample: `config.get()` is `string | undefined`, which `secret`
  // does not take under `strict`.
  const wrong = md(
    '# Signatures',
    '',
    FENCE + 'ts',
    "import { IdempotencyModule } from 'nest-idempotent-webhooks';",
    '',
    'export const signatures = IdempotencyModule.forRoot({',
    '  signatures: { stripe: { secret: process.env.STRIPE_WEBHOOK_SECRET } },',
    '});',
    FENCE,
  );
  const right = md(
    '<!-- doc-block: file=secrets.ts -->',
    FENCE + 'ts',
    "export const stripeSecret = process.env.STRIPE_WEBHOOK_SECRET ?? 'whsec_test';",
    FENCE,
    '',
    FENCE + 'ts',
    "import { IdempotencyModule } from 'nest-idempotent-webhooks';",
    "import { stripeSecret } from './secrets.js';",
    '',
    'export const signatures = IdempotencyModule.forRoot({ signatures: { stripe: { secret: stripeSecret } } });',
    FENCE,
  );

  it('passes blocks that compile under strict, a named block imported by another', async () => {
    await expect(check(right)).resolves.toEqual({ ok: true, output: '' });
    expect(await readFile(join(dir, 'doc-blocks/docs-fixture.md-L6.ts'), 'utf8')).toMatch(/^\n{6}import /);
  }, 60_000);

  it("fails a block that does not, with the error at the Markdown file's own line", async () => {
    const result = await check(wrong);
    expect(result.ok).toBe(false);
    expect(result.output).toMatch(/docs\/fixture\.md\(7,\d+\): error TS2322: Type 'string \| undefined'/);
  }, 60_000);
});
