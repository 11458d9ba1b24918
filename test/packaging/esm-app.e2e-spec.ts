import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  inMarkdownTerms,
  readDocumentation,
  writeDocBlocks,
  type Documentation,
} from '../support/doc-blocks.js';
import { createEmptyDatabase, type EmptyDatabase } from '../support/empty-database.js';
import { installPackedApp, type PackedApp } from '../support/packed-app.js';
import { runReadmeCommands } from '../support/readme-app.js';

/** npm install from the registry; a cold cache takes longest (later runs reuse .data/npm-cache). */
const INSTALL_TIMEOUT_MS = 360_000;
const RUN_TIMEOUT_MS = 120_000;
/** The package's entry points after its name: the root, then each subpath (package.json exports). */
const ENTRIES = ['', '/errors', '/operator', '/observability', '/testing'];

/** The version of `name` installed in the app. */
async function installedVersion(app: PackedApp, name: string): Promise<string> {
  const manifest = await readFile(join(app.dir, 'node_modules', name, 'package.json'), 'utf8');
  return (JSON.parse(manifest) as { version: string }).version;
}

/**
 * The published tarball in an ESM Nest 12 app as `nest new` makes it (`"type": "module"`,
 * nodenext, Vitest), on the versions this repository uses, plus what the README's and
 * docs/compatibility.md's Nest 12 install lines install. The app's own Vitest posts one event
 * twice against this run's PostgreSQL and also loads the CommonJS build beside the ESM one (the
 * dual-package hazard); here the effect is counted again in the database. Then every TypeScript
 * block of the README and docs/ is compiled in the app, under `strict`.
 */
describe('the packed library in an ESM Nest 12 app', () => {
  let db: EmptyDatabase;
  let app: PackedApp;
  let docs: Documentation;

  beforeAll(async () => {
    db = await createEmptyDatabase('pack_esm');
    docs = await readDocumentation(process.cwd());
    app = await installPackedApp('nest12-esm', docs.installs.get('nest12-esm') ?? []);
  }, INSTALL_TIMEOUT_MS);

  afterAll(async () => {
    await app?.remove();
    await db?.drop();
  });

  it(
    'resolves every entry point to the ESM build, and imports each in the app',
    async () => {
      const ids = ENTRIES.map((entry) => `nest-idempotent-webhooks${entry}`);
      const script = `await import('reflect-metadata'); console.log(JSON.stringify(await Promise.all(${JSON.stringify(ids)}.map(async (id) => [import.meta.resolve(id), Object.keys(await import(id)).length]))))`;
      const resolved = JSON.parse(await app.run('node', ['--input-type=module', '-e', script])) as [
        string,
        number,
      ][];
      expect(resolved.map(([url]) => url)).toEqual(
        ENTRIES.map(
          (entry) => `file://${app.dir}/node_modules/nest-idempotent-webhooks/dist/lib${entry}/index.js`,
        ),
      );
      for (const [, names] of resolved) expect(names).toBeGreaterThan(0);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    'type-checks against every entry point',
    async () => {
      await app.run('npx', ['tsc', '-p', 'tsconfig.json', '--noEmit']);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    "passes the app's own `npx vitest run`: a duplicate delivery has one effect",
    async () => {
      const output = await app.run('npx', ['vitest', 'run'], { DATABASE_URL: db.url });
      expect(output).toMatch(/Tests\s+5 passed \(5\)/);

      const orders = await db.pool.query(`SELECT event_id FROM orders ORDER BY event_id`);
      expect(orders.rows).toEqual([
        { event_id: 'evt_esm_1' },
        { event_id: 'evt_esm_dual' },
        { event_id: 'evt_esm_unit' },
      ]);
      const claims = await db.pool.query(`SELECT event_key, status FROM processed_events`);
      expect(claims.rows).toEqual([{ event_key: 'evt_esm_1', status: 'done' }]);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    'compiles every TypeScript block of the README and docs/ under strict',
    async () => {
      expect(docs.installs.get('nest12-esm')).toEqual(expect.arrayContaining(['@nestjs/typeorm', 'typeorm']));
      const version = async (name: string) =>
        (
          JSON.parse(await readFile(join(app.dir, 'node_modules', name, 'package.json'), 'utf8')) as {
            version: string;
          }
        ).version;
      expect(await version('@nestjs/core')).toMatch(/^12\./);

      expect(docs.blocks.length).toBeGreaterThan(10);
      const written = await writeDocBlocks(app.dir, docs.blocks, './tsconfig.json');
      try {
        await app.run('npx', ['tsc', '-p', written.tsconfig]);
      } catch (error) {
        throw new Error(inMarkdownTerms((error as Error).message, written), { cause: error });
      }
    },
    RUN_TIMEOUT_MS,
  );
  it(
    "runs the README's app from an empty database: its files as written boot, take the README's signed event, write one order",
    async () => {
      const empty = await createEmptyDatabase('readme_esm');
      try {
        // The files compiled as `nest new` sets up a Nest 12 app (nodenext, "type": "module"), then
        // `node dist/main.js` and the sender twice, as the README's commands run them.
        const run = await runReadmeCommands(app, docs, 'tsconfig.json', empty, 'evt_readme_esm');
        expect(run.tablesBefore).toEqual([]);
        expect(run.first.trim()).toBe('200');
        expect(run.second.trim()).toBe('200 (replayed)');
        expect(run.orders).toEqual([{ stripe_event_id: 'evt_readme_esm', amount: 2000 }]);
        expect(run.claims).toEqual([
          { scope: 'StripeWebhookController.handle', event_key: 'evt_readme_esm', status: 'done' },
        ]);
      } finally {
        await empty.drop();
      }
    },
    RUN_TIMEOUT_MS,
  );

  it(
    "installs OpenTelemetry's API and SDK from the docs' lines at versions that agree",
    async () => {
      expect(docs.installs.get('nest12-esm')).toEqual(
        expect.arrayContaining(['@opentelemetry/api@~1.9.0', '@opentelemetry/sdk-trace-base@^2']),
      );
      expect(await installedVersion(app, '@opentelemetry/api')).toMatch(/^1\.9\./);
      expect(await installedVersion(app, '@opentelemetry/sdk-trace-base')).toMatch(/^2\./);
      // npm ls exits 1 when an installed package is outside a range that asks for it (a peer too).
      const tree = await app.run('npm', ['ls', '@opentelemetry/api']);
      expect(tree).toContain('@opentelemetry/sdk-trace-base@2.');
      expect(tree).not.toContain('invalid');
    },
    RUN_TIMEOUT_MS,
  );
});
