import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { NestFactory } from '@nestjs/core';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { processedEventsMigrations } from '../../lib/index.js';
import { ClaimTableAppModule, type ClaimTableSettings } from '../fixtures/claim-table.fixture.js';
import { onAdapter, startApp } from '../support/app.js';
import { bootFailure } from '../support/boot-failure.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';

/** Runs the library's migrations for `options` on `url`, as an app's migrationsRun would. */
async function migrate(url: string, options: { schema?: string; table?: string }): Promise<void> {
  const dataSource = new DataSource({
    type: 'postgres',
    url,
    migrations: processedEventsMigrations(options),
  });
  await dataSource.initialize();
  try {
    await dataSource.runMigrations();
  } finally {
    await dataSource.destroy();
  }
}

/** The error the app fails to boot with. */
async function bootError(settings: ClaimTableSettings): Promise<Error> {
  const app = await NestFactory.create(ClaimTableAppModule.with(settings), {
    logger: false,
    abortOnError: false,
  });
  return bootFailure(app);
}

describe('the claims table is checked at start-up', () => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterAll(async () => {
    await db?.drop();
  });

  it('fails the boot, naming the table and the migrations, when the table does not exist', async () => {
    const error = await bootError({ databaseUrl: db.url, idempotency: { table: 'not_migrated' } });
    expect(error.message).toBe(
      'IdempotencyModule cannot start: the claims table "not_migrated" does not exist. Run the library\'s migrations (migrations: [...processedEventsMigrations()], or processedEventsMigrations({ schema, table }) for a table of your own), or check the schema and table options',
    );
  });

  it('fails the boot when the DataSource schema points where the migrations did not run', async () => {
    await db.pool.query('CREATE SCHEMA IF NOT EXISTS empty_schema');
    const error = await bootError({ databaseUrl: db.url, dataSourceSchema: 'empty_schema' });
    expect(error.message).toContain('the claims table "empty_schema"."processed_events" does not exist');
  });

  it("fails the boot naming what is wrong with a table that is not the migrations'", async () => {
    await db.pool.query(
      `CREATE TABLE lookalike (scope text, event_key text, source text, status text, attempts bigint, claimed_at timestamptz)`,
    );
    const error = await bootError({ databaseUrl: db.url, idempotency: { table: 'lookalike' } });
    expect(error.message).toBe(
      'IdempotencyModule cannot start: the claims table "lookalike" is not the one its migrations create (scope is text, not character varying; source is text, not character varying; status is text, not character varying; attempts is bigint, not integer; lease_token is missing; lease_expires_at is missing; completed_at is missing; last_error is missing; its primary key is not (scope, event_key)). Run the library\'s migrations, or point the schema and table options at the right table',
    );
  });

  it('boots on a table without the later indexes, with a warning for each that says which migrations add it', async () => {
    await migrate(db.url, { table: 'old_claims' });
    await db.pool.query('DROP INDEX old_claims_unfinished_idx');
    await db.pool.query('DROP INDEX old_claims_failed_idx');
    const logs = new LogCapture();
    const app = await NestFactory.create(
      ClaimTableAppModule.with({ databaseUrl: db.url, idempotency: { table: 'old_claims' } }),
      {
        logger: logs,
      },
    );
    await app.init();
    await app.close();
    expect(logs.find('warn', 'The claims table "old_claims" has no index on unfinished claims')).toHaveLength(
      1,
    );
    expect(
      logs.find(
        'warn',
        'The claims table "old_claims" has no index on failed claims',
        'processedEventsMigrations()',
      ),
    ).toHaveLength(1);
  });
});

describe.each(onAdapter('express'))('a claims table elsewhere (%s)', (adapter) => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
    await migrate(db.url, { schema: 'billing', table: 'webhook_claims' });
    await migrate(db.url, { schema: 'tenant' });
  });

  afterAll(async () => {
    await db?.drop();
  });

  const rows = async (table: string, id: string) =>
    (await db.pool.query(`SELECT status, attempts FROM ${table} WHERE event_key = $1`, [id])).rows;

  it.each([
    [
      'the schema and table options',
      { idempotency: { schema: 'billing', table: 'webhook_claims' } },
      'billing.webhook_claims',
    ],
    ["the DataSource's schema", { dataSourceSchema: 'tenant' }, 'tenant.processed_events'],
  ] as const)(
    'claims in the table %s name, in both modes, and nowhere else',
    async (_how, placement, table) => {
      const running = await startApp(adapter, [
        ClaimTableAppModule.with({ databaseUrl: db.url, ...placement }),
      ]);
      try {
        for (const path of ['/orders', '/external']) {
          const id = `evt_${path.slice(1)}_${table.replace('.', '_')}_${adapter}`;
          const first = await request(running.url).post(path).send({ id });
          expect(first.status).toBe(200);
          const second = await request(running.url).post(path).send({ id });
          expect(second.headers['idempotent-replayed']).toBe('true');
          expect(await rows(table, id)).toEqual([{ status: 'done', attempts: 1 }]);
          expect(await rows('public.processed_events', id)).toEqual([]);
        }
      } finally {
        await running.close();
      }
    },
  );
});
