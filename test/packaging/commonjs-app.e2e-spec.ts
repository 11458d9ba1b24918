import { readFile, rm } from 'node:fs/promises';
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
 * The published tarball in a CommonJS Nest 11 app as `nest new` made it (Nest 11, TypeORM 0.3,
 * ts-jest with Jest's default CommonJS runtime, `"module": "commonjs"`): the set-up the issue
 * reported failing with "Must use import to load ES Module". On top of the app's own packages it
 * gets what the README's and docs/compatibility.md's Nest 11 install lines install, as a reader
 * would run them. The app's own Jest posts one event twice against this run's PostgreSQL; here the
 * effect is counted again in the database. Then every TypeScript block of the README and docs/
 * is compiled in the app, under `strict`.
 */
describe('the packed library in a CommonJS Nest 11 app', () => {
  let db: EmptyDatabase;
  let app: PackedApp;
  let docs: Documentation;

  beforeAll(async () => {
    db = await createEmptyDatabase('pack_cjs');
    docs = await readDocumentation(process.cwd());
    app = await installPackedApp('nest11-commonjs', docs.installs.get('nest11-commonjs') ?? []);
  }, INSTALL_TIMEOUT_MS);

  afterAll(async () => {
    await app?.remove();
    await db?.drop();
  });

  it(
    'resolves every entry point to the CommonJS build, and requires each in the app',
    async () => {
      const ids = ENTRIES.map((entry) => `nest-idempotent-webhooks${entry}`);
      const script = `require('reflect-metadata'); console.log(JSON.stringify(${JSON.stringify(ids)}.map((id) => [require.resolve(id), Object.keys(require(id)).length])))`;
      const resolved = JSON.parse(await app.run('node', ['-e', script])) as [string, number][];
      expect(resolved.map(([path]) => path)).toEqual(
        ENTRIES.map((entry) => `${app.dir}/node_modules/nest-idempotent-webhooks/dist/cjs${entry}/index.js`),
      );
      for (const [, names] of resolved) expect(names).toBeGreaterThan(0);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    'type-checks against every entry point, with classic "module": "commonjs" and with nodenext',
    async () => {
      await app.run('npx', ['tsc', '-p', 'tsconfig.json', '--noEmit']);
      await app.run('npx', ['tsc', '-p', 'tsconfig.nodenext.json']);
    },
    RUN_TIMEOUT_MS,
  );

  it('installs, from the install lines of the docs, the Nest 11 majors that are CommonJS', async () => {
    const version = async (name: string) =>
      (
        JSON.parse(await readFile(join(app.dir, 'node_modules', name, 'package.json'), 'utf8')) as {
          version: string;
        }
      ).version;
    // The newest majors of these accept Nest 11 and are ES modules only.
    expect(docs.installs.get('nest11-commonjs')).toEqual(
      expect.arrayContaining([
        '@nestjs/typeorm@^11',
        'typeorm@^0.3',
        '@nestjs/schedule@^6',
        '@nestjs/config@^4',
      ]),
    );
    expect(await version('@nestjs/typeorm')).toMatch(/^11\./);
    expect(await version('typeorm')).toMatch(/^0\.3\./);
    expect(await version('@nestjs/schedule')).toMatch(/^6\./);
    expect(await version('@nestjs/bullmq')).toMatch(/^11\./);
    expect(await version('@nestjs/config')).toMatch(/^4\./);
    expect(await version('@nestjs/core')).toMatch(/^11\./);
  });

  it(
    "passes the app's own `npx jest`: a duplicate delivery has one effect",
    async () => {
      const output = await app.run('npx', ['jest'], { DATABASE_URL: db.url });
      expect(output).toMatch(/Tests:\s+4 passed, 4 total/);

      const orders = await db.pool.query(`SELECT event_id FROM orders ORDER BY event_id`);
      expect(orders.rows).toEqual([{ event_id: 'evt_cjs_1' }, { event_id: 'evt_cjs_unit' }]);
      const claims = await db.pool.query(`SELECT event_key, status FROM processed_events`);
      expect(claims.rows).toEqual([{ event_key: 'evt_cjs_1', status: 'done' }]);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    'compiles every TypeScript block of the README and docs/ under strict, but those marked esm-only',
    async () => {
      const blocks = docs.blocks.filter((block) => !block.esmOnly);
      expect(blocks.length).toBeGreaterThan(10);
      const written = await writeDocBlocks(app.dir, blocks, './tsconfig.json');
      try {
        await app.run('npx', ['tsc', '-p', written.tsconfig]);
      } catch (error) {
        throw new Error(inMarkdownTerms((error as Error).message, written), { cause: error });
      } finally {
        // The app's own tsconfig.json compiles every file under it.
        await rm(join(app.dir, 'doc-blocks'), { recursive: true, force: true });
      }
    },
    RUN_TIMEOUT_MS,
  );
  it(
    "runs the README's app from an empty database: its files as written boot, take the README's signed event, write one order",
    async () => {
      const empty = await createEmptyDatabase('readme_cjs');
      try {
        // Compiled as `nest new` sets up a Nest 11 app (nodenext with esModuleInterop, CommonJS
        // output): the sender's default import of stripe needs esModuleInterop at run time.
        const run = await runReadmeCommands(app, docs, 'tsconfig.nodenext.json', empty, 'evt_readme_cjs');
        expect(run.tablesBefore).toEqual([]);
        expect(run.first.trim()).toBe('200');
        expect(run.second.trim()).toBe('200 (replayed)');
        expect(run.orders).toEqual([{ stripe_event_id: 'evt_readme_cjs', amount: 2000 }]);
        expect(run.claims).toEqual([
          { scope: 'StripeWebhookController.handle', event_key: 'evt_readme_cjs', status: 'done' },
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
      expect(docs.installs.get('nest11-commonjs')).toEqual(
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
