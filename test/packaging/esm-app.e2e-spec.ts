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

/** npm install from the registry; a cold cache takes longest (later runs reuse .data/npm-cache). */
const INSTALL_TIMEOUT_MS = 360_000;
const RUN_TIMEOUT_MS = 120_000;

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
    'resolves both entry points to the ESM build',
    async () => {
      const script = `console.log(JSON.stringify(['nest-idempotent-webhooks', 'nest-idempotent-webhooks/testing'].map((id) => import.meta.resolve(id))))`;
      const resolved = JSON.parse(await app.run('node', ['--input-type=module', '-e', script])) as string[];
      expect(resolved).toEqual([
        `file://${app.dir}/node_modules/nest-idempotent-webhooks/dist/lib/index.js`,
        `file://${app.dir}/node_modules/nest-idempotent-webhooks/dist/lib/testing/index.js`,
      ]);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    'type-checks against both entry points',
    async () => {
      await app.run('npx', ['tsc', '-p', 'tsconfig.json', '--noEmit']);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    "passes the app's own `npx vitest run`: a duplicate delivery has one effect",
    async () => {
      const output = await app.run('npx', ['vitest', 'run'], { DATABASE_URL: db.url });
      expect(output).toMatch(/Tests\s+4 passed \(4\)/);

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
});
