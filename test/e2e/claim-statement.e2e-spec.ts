import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { DataSource } from 'typeorm';
import request from 'supertest';
import type { IdempotencyModuleOptions } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { onAdapter, type RunningApp } from '../support/app.js';
import {
  BY_ID_SCOPE,
  CAUGHT_SCOPE,
  claimStatementDeliveries,
} from '../support/claim-statement-deliveries.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';
import {
  BACKSLASH_SCOPE,
  BACKSLASH_SOURCE,
  INNER_FAILURE,
  QUOTED_SCOPE,
  QUOTED_SOURCE,
  TransactionEventCounter,
  type TransactionEventCounts,
} from '../fixtures/claim-statement.fixture.js';

/** The error logged when Postgres turned the COMMIT after a swallowed failed statement into a ROLLBACK. */
const abortedLog = (key: string) =>
  `Handler of ${CAUGHT_SCOPE} returned for key ${key} after a statement in its transaction failed; PostgreSQL rolled the COMMIT back and nothing was written. Let database errors propagate, or recover from them inside a nested manager.transaction()`;

/** 255 characters (the default maxKeyLength), a third of them quotes and backslashes. */
const LONG_QUOTED_KEY = `${"'".repeat(60)}${'\\'.repeat(25)}${"x'".repeat(85)}`;

/**
 * Keys that would break SQL built by pasting them between quotes. The one-round-trip claim sends
 * them as literals (quoted as pg's escapeLiteral quotes them) in a simple-protocol query, so each must still be claimed
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
  // Control characters are refused as keys (no header could carry them downstream): these are not.
  ['Unicode line and paragraph separators', 'line\u2028break\u2029para\u00a0nbsp'],
  ['only spaces', '   '],
  ['unicode and emoji', 'évènement_日本語_🎉👍🏽_\u00a0_\u200b'],
  ['255 characters of quotes and backslashes', LONG_QUOTED_KEY],
];

const hex = (text: string) => Buffer.from(text, 'utf8').toString('hex');

/**
 * The one-round-trip transaction claim (BEGIN and the claim in one query, handed to TypeORM) as
 * its users see it: keys and scopes stored exactly, nested transactions, handlers that swallow a
 * failed statement, TypeORM's subscribers, the DataSource's isolation level. The statements it
 * sends on the wire are pinned in wire-trace.e2e-spec.ts.
 */
describe.each(onAdapter('fastify'))('one-round-trip transaction claim (%s)', (adapter) => {
  let db: TestDatabase;
  const { start, closeAll, withApp, orders, claims, handled, deliverTwice, caughtOutcomes, deliverAborted } =
    claimStatementDeliveries(adapter, () => db);

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
    await closeAll();
    await db?.drop();
  });

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
  describe.each<[string, string, IdempotencyModuleOptions]>([
    ['default options', 'default', {}],
    ['preparedStatements: false', 'unprepared', { preparedStatements: false }],
  ])(
    'a handler that catches a failed statement outside a savepoint and returns (%s)',
    (_label, tag, idempotency) => {
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
