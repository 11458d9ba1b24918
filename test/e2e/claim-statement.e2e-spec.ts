import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import type { PoolClient } from 'pg';
import { DataSource } from 'typeorm';
import request from 'supertest';
import { IdempotencyMetrics, type IdempotencyModuleOptions } from '../../lib/index.js';
import { pgPoolOf } from '../../lib/postgres/typeorm-internals.js';
import { ClaimDatabase } from '../../lib/postgres/claim-database.js';
import { CLAIM_SQL, PREPARE_TRANSACTION_CLAIM, statementNames } from '../support/claim-sql.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';
import {
  BACKSLASH_SCOPE,
  BACKSLASH_SOURCE,
  ClaimStatementAppModule,
  ClaimStatementController,
  INNER_FAILURE,
  QUOTED_SCOPE,
  QUOTED_SOURCE,
  TransactionEventCounter,
  type ClaimStatementAppSettings,
  type TransactionEventCounts,
} from '../fixtures/claim-statement.fixture.js';

/** Scope of ClaimStatementController.byId, where the tricky keys are claimed. */
const BY_ID_SCOPE = 'ClaimStatementController.byId';

/** Scope of ClaimStatementController.caughtSqlError, whose handler swallows a failed statement. */
const CAUGHT_SCOPE = 'ClaimStatementController.caughtSqlError';

/** The 500's message when Postgres turned the COMMIT into a ROLLBACK. */
const abortedMessage = (key: string) =>
  `Event ${key} was not processed: a statement in its transaction failed, so nothing was committed; retry later`;

/** The error logged then. */
const abortedLog = (key: string) =>
  `Handler of ${CAUGHT_SCOPE} returned for key ${key} after a statement in its transaction failed; PostgreSQL rolled the COMMIT back and nothing was written. Let database errors propagate, or recover from them inside a nested manager.transaction()`;

/** 255 characters (the default maxKeyLength), a third of them quotes and backslashes. */
const LONG_QUOTED_KEY = `${"'".repeat(60)}${'\\'.repeat(25)}${"x'".repeat(85)}`;

/**
 * Keys that would break SQL built by pasting them between quotes. The one-round-trip claim sends
 * them as literals (pg's escapeLiteral) in a simple-protocol query, so each must still be claimed
 * as exactly itself.
 */
const TRICKY_KEYS: [string, string][] = [
  ['a single quote', "evt_'quote"],
  ['a backslash', 'back\\slash'],
  ['a trailing backslash', 'trailing\\'],
  ['a backslash before a quote', "\\'); DROP TABLE processed_events; --"],
  ['a statement injection', "'); DROP TABLE orders; --"],
  ['a parameter placeholder', '$1'],
  ['dollar quoting', '$$ $tag$ body $tag$ $$'],
  ['an escape-string literal', "E'x'"],
  ['doubled quotes', "''''"],
  ['double quotes and a semicolon', '"evt";'],
  ['comment markers', '-- /* evt */'],
  ['a percent and a question mark', '%s %d ? :name'],
  ['control characters', 'line\nbreak\ttab\rreturn\u0001\u001f'],
  ['only spaces', '   '],
  ['unicode and emoji', 'évènement_日本語_🎉👍🏽_\u00a0_\u200b'],
  ['255 characters of quotes and backslashes', LONG_QUOTED_KEY],
];

const hex = (text: string) => Buffer.from(text, 'utf8').toString('hex');

/** Records the text of every query sent on one pg connection, from now on. */
function recordQueries(client: PoolClient): string[] {
  const sent: string[] = [];
  const target = client as unknown as { query: (...args: unknown[]) => unknown };
  const query = target.query.bind(client);
  target.query = (config: unknown, ...rest: unknown[]) => {
    sent.push(typeof config === 'string' ? config : String((config as { text?: string }).text));
    return query(config, ...rest);
  };
  return sent;
}

/**
 * The transaction control in `sent`: BEGIN (with what travels with it), ROLLBACK, COMMIT. The
 * handler's own statements are left out.
 */
function transactionControl(sent: string[]): string[] {
  return sent.flatMap((text) => {
    if (/^\s*(ROLLBACK|COMMIT)\b/.test(text)) return [text.trim()];
    if (!/^\s*BEGIN\b/.test(text)) return [];
    const parts = ['BEGIN'];
    if (text.includes(`PREPARE ${CLAIM_SQL.transactionClaim.name}`)) parts.push('PREPARE');
    if (text.includes(`EXECUTE ${CLAIM_SQL.transactionClaim.name}`)) parts.push('EXECUTE');
    return [parts.join('; ')];
  });
}

/** The one connection of a `poolSize: 1` app, with a recorder on it. */
async function onlyConnection(running: RunningApp): Promise<{ sent: string[] }> {
  const pool = pgPoolOf(running.app.get(DataSource));
  const client = await pool.connect();
  client.release();
  expect(pool.totalCount).toBe(1);
  return { sent: recordQueries(client) };
}

describe.each(ADAPTERS)('one-round-trip transaction claim (%s)', (adapter) => {
  let db: TestDatabase;
  const apps: RunningApp[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(
      `CREATE TABLE deferred_orders (
         event_id text NOT NULL,
         CONSTRAINT deferred_orders_event_id UNIQUE (event_id) DEFERRABLE INITIALLY DEFERRED
       )`,
    );
  });

  afterAll(async () => {
    await Promise.all(apps.map((running) => running.close()));
    await db?.drop();
  });

  const start = async (settings: Omit<ClaimStatementAppSettings, 'databaseUrl'> = {}) => {
    const running = await startApp(adapter, [
      ClaimStatementAppModule.forDatabase({ databaseUrl: db.url, ...settings }),
    ]);
    apps.push(running);
    return running;
  };
  /** Starts an app for one test only; `use` runs with it and it is closed afterwards. */
  const withApp = async (
    settings: Omit<ClaimStatementAppSettings, 'databaseUrl'>,
    use: (running: RunningApp) => Promise<void>,
  ) => {
    const running = await startApp(adapter, [
      ClaimStatementAppModule.forDatabase({ databaseUrl: db.url, ...settings }),
    ]);
    try {
      await use(running);
    } finally {
      await running.close();
    }
  };
  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  // Claims that committed: a handler's failure leaves a failed record, which claims nothing.
  const claims = (id: string) =>
    db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [id]);
  const handled = (running: RunningApp, route: string, key: string) =>
    running.app.get(ClaimStatementController).callsOf(route, key);
  /** Sends a delivery twice: processed, then replayed without calling the handler. */
  const deliverTwice = async (running: RunningApp, path: string, id: string) => {
    const first = await request(running.url).post(path).send({ id });
    expect(first.status).toBe(200);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    const second = await request(running.url).post(path).send({ id });
    expect(second.status).toBe(200);
    expect(second.headers['idempotent-replayed']).toBe('true');
    return first;
  };
  /** Outcomes counted in CAUGHT_SCOPE by one app. */
  const caughtOutcomes = (running: RunningApp) =>
    running.app.get(IdempotencyMetrics).snapshot().claims[CAUGHT_SCOPE] ?? {};
  /**
   * One delivery to caught-sql-error: the handler runs, Postgres rolls the COMMIT back, and the
   * answer is a 500 (never a 200 for nothing committed). Nothing is written, and the outcome is
   * counted 'failed', never 'claimed'.
   */
  const deliverAborted = async (running: RunningApp, id: string) => {
    const before = caughtOutcomes(running);
    const calls = handled(running, 'caught-sql-error', id);
    const answer = await request(running.url).post('/claims/caught-sql-error').send({ id });
    expect(answer.status).toBe(500);
    expect(answer.body).toEqual({
      statusCode: 500,
      message: abortedMessage(id),
      error: 'Internal Server Error',
    });
    expect(answer.headers['idempotent-replayed']).toBeUndefined();
    expect(handled(running, 'caught-sql-error', id)).toBe(calls + 1);
    expect(await orders(id)).toBe(0);
    expect(await claims(id)).toBe(0);
    expect(caughtOutcomes(running)).toEqual({ ...before, failed: (before.failed ?? 0) + 1 });
  };

  describe('keys, scopes and sources that naive SQL building would break', () => {
    let running: RunningApp;

    beforeAll(async () => {
      running = await start();
    });

    /** Every key claimed in BY_ID_SCOPE, and every order, as UTF-8 hex: exact, whatever the bytes. */
    const snapshot = async () => ({
      claims: (
        await db.pool.query(
          `SELECT encode(convert_to(event_key, 'UTF8'), 'hex') AS hex, source, status
           FROM processed_events WHERE scope = $1`,
          [BY_ID_SCOPE],
        )
      ).rows as { hex: string; source: string; status: string }[],
      orders: (
        await db.pool.query(`SELECT encode(convert_to(event_id, 'UTF8'), 'hex') AS hex FROM orders`)
      ).rows.map((row: { hex: string }) => row.hex),
    });

    it.each(TRICKY_KEYS)('claims and replays a key with %s, stored byte for byte', async (_label, key) => {
      const before = await snapshot();
      const first = await deliverTwice(running, '/claims/by-id', key);
      expect(first.body).toEqual({ processed: key });
      expect(handled(running, 'by-id', key)).toBe(1);

      // Exactly one new claim and one new order, each holding the key's exact bytes.
      const after = await snapshot();
      const known = new Set(before.claims.map((row) => row.hex));
      expect(after.claims.filter((row) => !known.has(row.hex))).toEqual([
        { hex: hex(key), source: 'claims', status: 'done' },
      ]);
      expect(after.claims).toHaveLength(before.claims.length + 1);
      expect(after.orders.filter((row) => !before.orders.includes(row))).toEqual([hex(key)]);
      expect(after.orders).toHaveLength(before.orders.length + 1);
      expect(await claims(key)).toBe(1);
      expect(await orders(key)).toBe(1);

      // Nothing the key spelled ran: both tables are still there.
      const { rows } = await db.pool.query(
        `SELECT to_regclass('orders') IS NOT NULL AS orders, to_regclass('processed_events') IS NOT NULL AS claims`,
      );
      expect(rows).toEqual([{ orders: true, claims: true }]);
    });

    it('claims every tricky key separately: one claim and one order per key', async () => {
      const { rows } = await db.pool.query(
        `SELECT event_key FROM processed_events WHERE scope = $1 ORDER BY event_key`,
        [BY_ID_SCOPE],
      );
      const keys = TRICKY_KEYS.map(([, key]) => key);
      expect(rows.map((row: { event_key: string }) => row.event_key).sort()).toEqual([...keys].sort());
      expect(await db.count('SELECT count(*) FROM orders WHERE event_id = ANY($1)', [keys])).toBe(
        keys.length,
      );
    });

    it('runs concurrent deliveries of a quoted key exactly once, with no 5xx', async () => {
      const key = "evt_'burst\\";
      const answers = await Promise.all(
        Array.from({ length: 20 }, () => request(running.url).post('/claims/by-id').send({ id: key })),
      );
      const statuses = answers.map((answer) => answer.status);
      expect(statuses.filter((status) => status !== 200 && status !== 409)).toEqual([]);
      expect(
        answers.filter((answer) => answer.status === 200 && !answer.headers['idempotent-replayed']),
      ).toHaveLength(1);
      expect(handled(running, 'by-id', key)).toBe(1);
      expect(await orders(key)).toBe(1);
      expect(await claims(key)).toBe(1);
    });

    it.each([
      ['quotes', '/claims/quoted-scope', 'quoted-scope', QUOTED_SCOPE, QUOTED_SOURCE],
      ['backslashes', '/claims/backslash-scope', 'backslash-scope', BACKSLASH_SCOPE, BACKSLASH_SOURCE],
    ])(
      'stores a decorator scope and source with %s exactly, and replays in that scope',
      async (_label, path, route, scope, source) => {
        const key = `evt_scope_${route}`;
        const first = await deliverTwice(running, path, key);
        expect(first.body).toEqual({ processed: key });
        expect(handled(running, route, key)).toBe(1);
        const { rows } = await db.pool.query(
          'SELECT scope, source, status FROM processed_events WHERE event_key = $1',
          [key],
        );
        expect(rows).toEqual([{ scope, source, status: 'done' }]);
        expect(await orders(key)).toBe(1);
      },
    );
  });

  describe('prepared statement bookkeeping on a single pooled connection', () => {
    const preparedClaims = (running: RunningApp): Promise<{ name: string }[]> =>
      running.app
        .get(DataSource)
        .query(`SELECT name FROM pg_prepared_statements WHERE name LIKE 'idempotency_%'`);

    it('re-prepares after DEALLOCATE ALL, for a duplicate and for a new event', async () => {
      await withApp({ poolSize: 1 }, async (running) => {
        const connection = await onlyConnection(running);
        const firstId = `evt_dealloc_1_${adapter}`;
        await deliverTwice(running, '/claims/by-id', firstId);
        expect(transactionControl(connection.sent)).toEqual([
          'BEGIN; PREPARE; EXECUTE',
          'COMMIT',
          'BEGIN; EXECUTE',
          'ROLLBACK',
        ]);
        expect(await preparedClaims(running)).toEqual([{ name: CLAIM_SQL.transactionClaim.name }]);

        // The connection forgets the statement; the module still believes it has it.
        await running.app.get(DataSource).query('DEALLOCATE ALL');
        expect(await preparedClaims(running)).toEqual([]);
        connection.sent.length = 0;
        const replay = await request(running.url).post('/claims/by-id').send({ id: firstId });
        expect(replay.status).toBe(200);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(transactionControl(connection.sent)).toEqual([
          'BEGIN; EXECUTE',
          'ROLLBACK',
          'BEGIN; PREPARE; EXECUTE',
          'ROLLBACK',
        ]);

        await running.app.get(DataSource).query('DEALLOCATE ALL');
        connection.sent.length = 0;
        const secondId = `evt_dealloc_2_${adapter}`;
        await deliverTwice(running, '/claims/by-id', secondId);
        expect(transactionControl(connection.sent)).toEqual([
          'BEGIN; EXECUTE',
          'ROLLBACK',
          'BEGIN; PREPARE; EXECUTE',
          'COMMIT',
          'BEGIN; EXECUTE',
          'ROLLBACK',
        ]);

        for (const id of [firstId, secondId]) {
          expect(handled(running, 'by-id', id)).toBe(1);
          expect(await orders(id)).toBe(1);
          expect(await claims(id)).toBe(1);
        }
        expect(await preparedClaims(running)).toEqual([{ name: CLAIM_SQL.transactionClaim.name }]);
      });
    });

    it('sends an external claim again on another connection after DEALLOCATE ALL', async () => {
      await withApp({ poolSize: 1 }, async (running) => {
        const dataSource = running.app.get(DataSource);
        const backend = async (): Promise<number> =>
          (await dataSource.query('SELECT pg_backend_pid() AS pid'))[0].pid;
        const leaseStatements = async () => (await preparedClaims(running)).map((row) => row.name).sort();
        const firstId = `evt_dealloc_external_1_${adapter}`;
        await deliverTwice(running, '/claims/external', firstId);
        // The new event's claim and completion, and the duplicate's read of why it claimed nothing.
        expect(await leaseStatements()).toEqual(statementNames('claimState', 'leaseClaim', 'leaseComplete'));
        const forgetful = await backend();

        // pg still believes the connection has them: its next EXECUTE fails there (26000) without
        // running, pg-pool drops that connection, and the claim goes again, unprepared.
        await dataSource.query('DEALLOCATE ALL');
        const secondId = `evt_dealloc_external_2_${adapter}`;
        await deliverTwice(running, '/claims/external', secondId);
        expect(await backend()).not.toBe(forgetful);
        expect(await leaseStatements()).toEqual(statementNames('claimState', 'leaseClaim', 'leaseComplete'));

        // A duplicate is the first to find the statements gone: still replayed, not a 503.
        await dataSource.query('DEALLOCATE ALL');
        const replay = await request(running.url).post('/claims/external').send({ id: firstId });
        expect(replay.status).toBe(200);
        expect(replay.headers['idempotent-replayed']).toBe('true');

        for (const id of [firstId, secondId]) {
          expect(handled(running, 'external', id)).toBe(1);
          expect(await orders(id)).toBe(1);
          const { rows } = await db.pool.query(
            'SELECT status, attempts FROM processed_events WHERE event_key = $1',
            [id],
          );
          expect(rows).toEqual([{ status: 'done', attempts: 1 }]);
        }
      });
    });

    it('never answers 503 for forgotten statements, and stops preparing after three misses (auto)', async () => {
      await withApp({ poolSize: 3 }, async (running) => {
        const logs = new LogCapture();
        running.app.useLogger(logs);
        // Three connections on which pg has prepared the lease claim and Postgres has forgotten
        // it, as a transaction-mode pooler's server connections would look.
        const pool = pgPoolOf(running.app.get(DataSource));
        const clients = await Promise.all([pool.connect(), pool.connect(), pool.connect()]);
        for (const [index, client] of clients.entries()) {
          const warmKey = `evt_warm_${index}_${adapter}`;
          await client.query({
            name: CLAIM_SQL.leaseClaim.name,
            text: CLAIM_SQL.leaseClaim.text,
            // The checked lease claim: fingerprint and whether conflicts are refused last.
            values: ['Warm.scope', warmKey, 'warm', randomUUID(), 60_000, '5000ms', null, false],
          });
          await client.query('DEALLOCATE ALL');
        }
        for (const client of clients) client.release();

        // Each delivery's claim misses on one of them (it did not run) and goes again unprepared.
        const ids = [1, 2, 3].map((n) => `evt_forgotten_${n}_${adapter}`);
        for (const id of ids) {
          const answer = await request(running.url).post('/claims/external').send({ id });
          expect(answer.status).toBe(200);
          expect(handled(running, 'external', id)).toBe(1);
          expect(await orders(id)).toBe(1);
        }
        expect(logs.find('warn', 'Prepared statements turned off: 3 statements')).toHaveLength(1);

        // From then on nothing is prepared: every statement of the next event goes unnamed.
        const names: unknown[] = [];
        const target = pool as unknown as { query: (...args: unknown[]) => unknown };
        const query = target.query.bind(pool);
        target.query = (config: unknown, ...rest: unknown[]) => {
          names.push((config as { name?: string })?.name);
          return query(config, ...rest);
        };
        await deliverTwice(running, '/claims/external', `evt_after_off_${adapter}`);
        target.query = query;
        expect(names.length).toBeGreaterThanOrEqual(3);
        expect(names.filter((name) => name !== undefined)).toEqual([]);
        expect(logs.find('warn', 'Prepared statements turned off')).toHaveLength(1);
      });
    });

    it('adopts a statement the connection already has (42P05) on its first delivery', async () => {
      await withApp({ poolSize: 1 }, async (running) => {
        const connection = await onlyConnection(running);
        await running.app.get(DataSource).query(PREPARE_TRANSACTION_CLAIM);
        expect(await preparedClaims(running)).toEqual([{ name: CLAIM_SQL.transactionClaim.name }]);

        const id = `evt_preprepared_${adapter}`;
        await deliverTwice(running, '/claims/by-id', id);
        expect(transactionControl(connection.sent)).toEqual([
          'BEGIN; PREPARE; EXECUTE',
          'ROLLBACK',
          'BEGIN; EXECUTE',
          'COMMIT',
          'BEGIN; EXECUTE',
          'ROLLBACK',
        ]);
        expect(handled(running, 'by-id', id)).toBe(1);
        expect(await orders(id)).toBe(1);
        expect(await claims(id)).toBe(1);
        expect(await preparedClaims(running)).toEqual([{ name: CLAIM_SQL.transactionClaim.name }]);
      });
    });

    it('keeps the statement its first claim prepared when that claim times out on a held lock', async () => {
      await withApp({ poolSize: 1, idempotency: { concurrentDuplicateWaitMs: 50 } }, async (running) => {
        const connection = await onlyConnection(running);
        const id = `evt_locked_first_${adapter}`;
        // Another session holds an uncommitted claim of the key: the app's first claim waits
        // out its lock_timeout inside the query that also prepared the statement.
        const holder = await db.pool.connect();
        try {
          await holder.query('BEGIN');
          await holder.query(
            `INSERT INTO processed_events (scope, event_key, source, status) VALUES ($1, $2, 'holder', 'done')`,
            [BY_ID_SCOPE, id],
          );
          const busy = await request(running.url).post('/claims/by-id').send({ id });
          expect(busy.status).toBe(409);
          expect(handled(running, 'by-id', id)).toBe(0);
        } finally {
          await holder.query('ROLLBACK');
          holder.release();
        }
        expect(await preparedClaims(running)).toEqual([{ name: CLAIM_SQL.transactionClaim.name }]);

        await deliverTwice(running, '/claims/by-id', id);
        // The PREPARE ran before the claim timed out, and outlived the rollback: the next claim
        // EXECUTEs it straight away (no 42P05 miss, which 'auto' would count toward giving up).
        expect(transactionControl(connection.sent)).toEqual([
          'BEGIN; PREPARE; EXECUTE',
          'ROLLBACK',
          'BEGIN; EXECUTE',
          'COMMIT',
          'BEGIN; EXECUTE',
          'ROLLBACK',
        ]);
        expect(running.app.get(ClaimDatabase).prepared.missCount).toBe(0);
        expect(handled(running, 'by-id', id)).toBe(1);
        expect(await orders(id)).toBe(1);
        const { rows } = await db.pool.query('SELECT source FROM processed_events WHERE event_key = $1', [
          id,
        ]);
        expect(rows).toEqual([{ source: 'claims' }]);
      });
    });

    it('keeps the statement a failed first delivery prepared, and the redelivery runs', async () => {
      await withApp({ poolSize: 1 }, async (running) => {
        const connection = await onlyConnection(running);
        const id = `evt_fails_first_${adapter}`;
        const failed = await request(running.url).post('/claims/throws-after-write').send({ id });
        expect(failed.status).toBe(500);
        expect(await orders(id)).toBe(0);
        expect(await claims(id)).toBe(0);
        expect(await preparedClaims(running)).toEqual([{ name: CLAIM_SQL.transactionClaim.name }]);

        await deliverTwice(running, '/claims/throws-after-write', id);
        expect(transactionControl(connection.sent)).toEqual([
          'BEGIN; PREPARE; EXECUTE',
          'ROLLBACK',
          'BEGIN; EXECUTE',
          'COMMIT',
          'BEGIN; EXECUTE',
          'ROLLBACK',
        ]);
        expect(handled(running, 'throws-after-write', id)).toBe(2);
        expect(await orders(id)).toBe(1);
        expect(await claims(id)).toBe(1);
      });
    });
  });

  describe('nested transactions in a handler', () => {
    let running: RunningApp;

    beforeAll(async () => {
      running = await start();
    });

    it('rolls back a nested transaction that throws to its savepoint; the outer write and claim commit', async () => {
      const id = `evt_nested_throws_${adapter}`;
      const first = await deliverTwice(running, '/claims/nested/inner-throws', id);
      expect(first.body).toEqual({ processed: id, inner: INNER_FAILURE });
      expect(handled(running, 'nested/inner-throws', id)).toBe(1);
      expect(await orders(id)).toBe(1);
      expect(await orders(`${id}:inner`)).toBe(0);
      expect(await claims(id)).toBe(1);
    });

    it('recovers the transaction after a nested statement fails in Postgres', async () => {
      const id = `evt_nested_sql_${adapter}`;
      const first = await deliverTwice(running, '/claims/nested/inner-sql-error', id);
      // 23505: the nested INSERT repeats the outer order's unique event_id.
      expect(first.body).toEqual({ processed: id, inner: '23505' });
      expect(handled(running, 'nested/inner-sql-error', id)).toBe(1);
      expect(await orders(id)).toBe(1);
      expect(await orders(`${id}:after`)).toBe(1);
      expect(await claims(id)).toBe(1);
    });

    it('commits a nested transaction that succeeds with the outer write and the claim', async () => {
      const id = `evt_nested_ok_${adapter}`;
      const first = await deliverTwice(running, '/claims/nested/commits', id);
      expect(first.body).toEqual({ processed: id });
      expect(handled(running, 'nested/commits', id)).toBe(1);
      expect(await orders(id)).toBe(1);
      expect(await orders(`${id}:inner`)).toBe(1);
      expect(await claims(id)).toBe(1);
    });

    it('commits nothing when the handler throws after writing, so the redelivery runs it', async () => {
      const id = `evt_throws_${adapter}`;
      const failed = await request(running.url).post('/claims/throws-after-write').send({ id });
      expect(failed.status).toBe(500);
      expect(handled(running, 'throws-after-write', id)).toBe(1);
      expect(await orders(id)).toBe(0);
      expect(await claims(id)).toBe(0);

      await deliverTwice(running, '/claims/throws-after-write', id);
      expect(handled(running, 'throws-after-write', id)).toBe(2);
      expect(await orders(id)).toBe(1);
      expect(await claims(id)).toBe(1);
    });
  });

  // The control, a failed statement caught inside a nested manager.transaction() (its savepoint
  // is rolled back, so the outer transaction commits), is 'recovers the transaction after a
  // nested statement fails in Postgres' above.
  describe.each<[string, string, IdempotencyModuleOptions, string[]]>([
    ['default options', 'default', {}, ['BEGIN; PREPARE; EXECUTE', 'COMMIT', 'BEGIN; EXECUTE', 'COMMIT']],
    // Unprepared, BEGIN and the claim still travel together, the claim's values inlined.
    [
      'preparedStatements: false',
      'unprepared',
      { preparedStatements: false },
      ['BEGIN', 'COMMIT', 'BEGIN', 'COMMIT'],
    ],
  ])(
    'a handler that catches a failed statement outside a savepoint and returns (%s)',
    (_label, tag, idempotency, control) => {
      let running: RunningApp;
      const logs = new LogCapture();

      beforeAll(async () => {
        running = await start({ idempotency });
        // Nest's logger is process-wide and each startApp resets it: install the capture last.
        running.app.useLogger(logs);
      });

      it('is answered 500 with nothing written, and every redelivery runs the handler again', async () => {
        const id = `evt_caught_${tag}_${adapter}`;
        logs.clear();
        await deliverAborted(running, id);
        expect(logs.find('error', abortedLog(id))).toHaveLength(1);

        // Never marked done: the redelivery is claimed and run again, and aborted again.
        await deliverAborted(running, id);
        expect(handled(running, 'caught-sql-error', id)).toBe(2);
        expect(logs.find('error', abortedLog(id))).toHaveLength(2);
        expect(caughtOutcomes(running).claimed).toBeUndefined();
      });

      it('answers a COMMIT refused by a deferred constraint 500 (the handler failed), not 503, with nothing written', async () => {
        const id = `evt_deferred_${tag}_${adapter}`;
        const scope = 'ClaimStatementController.deferredViolation';
        for (const attempt of [1, 2]) {
          const answer = await request(running.url).post('/claims/deferred-violation').send({ id });
          // Not "the database is unavailable" with Retry-After: the handler's data was refused.
          expect(answer.status).toBe(500);
          expect(answer.headers['retry-after']).toBeUndefined();
          expect(handled(running, 'deferred-violation', id)).toBe(attempt);
          expect(await db.count('SELECT count(*) FROM deferred_orders WHERE event_id = $1', [id])).toBe(0);
          expect(await claims(id)).toBe(0);
          expect(running.app.get(IdempotencyMetrics).snapshot().claims[scope]).toEqual({ failed: attempt });
        }
      });

      it('sends no ROLLBACK after the rolled-back COMMIT; the next delivery on that connection commits', async () => {
        await withApp({ poolSize: 1, idempotency }, async (single) => {
          const connection = await onlyConnection(single);
          const id = `evt_caught_single_${tag}_${adapter}`;
          await deliverAborted(single, id);
          const next = `${id}_next`;
          const processed = await request(single.url).post('/claims/by-id').send({ id: next });
          expect(processed.status).toBe(200);
          expect(processed.body).toEqual({ processed: next });
          expect(transactionControl(connection.sent)).toEqual(control);
          expect(await orders(next)).toBe(1);
          expect(await claims(next)).toBe(1);
          expect(await orders(id)).toBe(0);
          expect(await claims(id)).toBe(0);
        });
      });
    },
  );

  // Both begin the transaction on the connection and adopt it into TypeORM, which must still
  // broadcast every start, commit and rollback to subscribers.
  describe.each([true, false])('TypeORM subscribers (preparedStatements: %s)', (preparedStatements) => {
    let running: RunningApp;
    let counter: TransactionEventCounter;

    beforeAll(async () => {
      running = await start({ subscribers: true, idempotency: { preparedStatements } });
      counter = running.app
        .get(DataSource)
        .subscribers.find((subscriber) => subscriber instanceof TransactionEventCounter)!;
    });

    /** The events broadcast since `before` was taken (`{ ...counter.counts }`). */
    const eventsSince = (before: TransactionEventCounts) =>
      Object.fromEntries(
        Object.entries(counter.counts).map(([name, count]) => [
          name,
          count - before[name as keyof TransactionEventCounts],
        ]),
      );
    /** The events one delivery broadcasts. */
    const eventsOf = async (path: string, id: string) => {
      const before = { ...counter.counts };
      const answer = await request(running.url).post(path).send({ id });
      return { answer, delta: eventsSince(before) };
    };
    const events = (start: number, commit: number, rollback: number): TransactionEventCounts => ({
      beforeStart: start,
      afterStart: start,
      beforeCommit: commit,
      afterCommit: commit,
      beforeRollback: rollback,
      afterRollback: rollback,
    });

    it('a processed delivery starts and commits once; its duplicate starts and rolls back once', async () => {
      expect(counter).toBeInstanceOf(TransactionEventCounter);
      const id = `evt_subscribed_${preparedStatements}_${adapter}`;
      const processed = await eventsOf('/claims/by-id', id);
      expect(processed.answer.status).toBe(200);
      expect(processed.answer.headers['idempotent-replayed']).toBeUndefined();
      expect(processed.delta).toEqual(events(1, 1, 0));
      expect(counter.activeAfterStart.at(-1)).toBe(true);
      expect(await orders(id)).toBe(1);
      expect(await claims(id)).toBe(1);

      const replayed = await eventsOf('/claims/by-id', id);
      expect(replayed.answer.status).toBe(200);
      expect(replayed.answer.headers['idempotent-replayed']).toBe('true');
      expect(replayed.delta).toEqual(events(1, 0, 1));
      expect(handled(running, 'by-id', id)).toBe(1);
      expect(await orders(id)).toBe(1);
    });

    it('a handler that throws starts once and rolls back once, committing nothing', async () => {
      const id = `evt_subscribed_throws_${preparedStatements}_${adapter}`;
      const failed = await eventsOf('/claims/throws-after-write', id);
      expect(failed.answer.status).toBe(500);
      expect(failed.delta).toEqual(events(1, 0, 1));
      expect(await orders(id)).toBe(0);
      expect(await claims(id)).toBe(0);
    });

    it('a handler that catches a failed statement: 500, nothing written, a rollback and no AfterTransactionCommit', async () => {
      const id = `evt_subscribed_caught_${preparedStatements}_${adapter}`;
      for (const attempt of [1, 2]) {
        const before = { ...counter.counts };
        await deliverAborted(running, id);
        // Subscribers hear the start and BeforeTransactionCommit; the COMMIT came back ROLLBACK,
        // so no AfterTransactionCommit follows but the rollback does, as after TypeORM's own
        // failed commit: a subscriber that buffers work until commit can drop it.
        expect(eventsSince(before)).toEqual({
          beforeStart: 1,
          afterStart: 1,
          beforeCommit: 1,
          afterCommit: 0,
          beforeRollback: 1,
          afterRollback: 1,
        });
        expect(handled(running, 'caught-sql-error', id)).toBe(attempt);
      }
      expect(caughtOutcomes(running).claimed).toBeUndefined();
    });

    it('a nested transaction is a second start and commit (its savepoint)', async () => {
      const id = `evt_subscribed_nested_${preparedStatements}_${adapter}`;
      const processed = await eventsOf('/claims/nested/commits', id);
      expect(processed.answer.status).toBe(200);
      expect(processed.delta).toEqual(events(2, 2, 0));
      expect(await orders(id)).toBe(1);
      expect(await orders(`${id}:inner`)).toBe(1);
      expect(await claims(id)).toBe(1);
    });
  });

  describe('the DataSource isolationLevel', () => {
    it.each([
      ['SERIALIZABLE', true, 'serializable'],
      ['SERIALIZABLE', false, 'serializable'],
      ['REPEATABLE READ', true, 'repeatable read'],
      ['READ UNCOMMITTED', true, 'read uncommitted'],
      [undefined, true, 'read committed'],
    ] as const)(
      'isolationLevel %p, preparedStatements %p: the handler runs at %s',
      async (isolationLevel, preparedStatements, level) => {
        await withApp({ isolationLevel, idempotency: { preparedStatements } }, async (running) => {
          const id = `evt_isolation_${isolationLevel ?? 'default'}_${preparedStatements}_${adapter}`;
          const first = await deliverTwice(running, '/claims/isolation', id);
          // The claim's lock_timeout bound is lifted before the handler runs.
          expect(first.body).toEqual({ processed: id, level, lockTimeout: '0' });
          expect(handled(running, 'isolation', id)).toBe(1);
          expect(await orders(id)).toBe(1);
          expect(await claims(id)).toBe(1);
        });
      },
    );
  });
});
