import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createEmptyDatabase, type EmptyDatabase } from '../support/empty-database.js';
import { installPackedApp, type PackedApp } from '../support/packed-app.js';

/** npm install from the registry; a cold cache takes longest (later runs reuse .data/npm-cache). */
const INSTALL_TIMEOUT_MS = 240_000;
const RUN_TIMEOUT_MS = 120_000;

/**
 * The published tarball in a CommonJS Nest 11 app as `nest new` made it (Nest 11, TypeORM 0.3,
 * ts-jest with Jest's default CommonJS runtime, `"module": "commonjs"`): the set-up the issue
 * reported failing with "Must use import to load ES Module". The app's own Jest posts one event
 * twice against this run's PostgreSQL; here the effect is counted again in the database.
 */
describe('the packed library in a CommonJS Nest 11 app', () => {
  let db: EmptyDatabase;
  let app: PackedApp;

  beforeAll(async () => {
    db = await createEmptyDatabase('pack_cjs');
    app = await installPackedApp('nest11-commonjs');
  }, INSTALL_TIMEOUT_MS);

  afterAll(async () => {
    await app?.remove();
    await db?.drop();
  });

  it(
    'resolves both entry points to the CommonJS build',
    async () => {
      const script = `console.log(JSON.stringify(['nest-idempotent-webhooks', 'nest-idempotent-webhooks/testing'].map((id) => require.resolve(id))))`;
      const resolved = JSON.parse(await app.run('node', ['-e', script])) as string[];
      expect(resolved).toEqual([
        `${app.dir}/node_modules/nest-idempotent-webhooks/dist/cjs/index.js`,
        `${app.dir}/node_modules/nest-idempotent-webhooks/dist/cjs/testing/index.js`,
      ]);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    'type-checks against both entry points, with classic "module": "commonjs" and with nodenext',
    async () => {
      await app.run('npx', ['tsc', '-p', 'tsconfig.json', '--noEmit']);
      await app.run('npx', ['tsc', '-p', 'tsconfig.nodenext.json']);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    "passes the app's own `npx jest`: a duplicate delivery has one effect",
    async () => {
      const output = await app.run('npx', ['jest'], { DATABASE_URL: db.url });
      expect(output).toMatch(/Tests:\s+3 passed, 3 total/);

      const orders = await db.pool.query(`SELECT event_id FROM orders ORDER BY event_id`);
      expect(orders.rows).toEqual([{ event_id: 'evt_cjs_1' }, { event_id: 'evt_cjs_unit' }]);
      const claims = await db.pool.query(`SELECT event_key, status FROM processed_events`);
      expect(claims.rows).toEqual([{ event_key: 'evt_cjs_1', status: 'done' }]);
    },
    RUN_TIMEOUT_MS,
  );
});
