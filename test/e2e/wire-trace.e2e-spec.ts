import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import type { PoolClient } from 'pg';
import { DataSource } from 'typeorm';
import request from 'supertest';
import type { IdempotencyModuleOptions } from '../../lib/index.js';
import { pgPoolOf } from '../../lib/postgres/typeorm-internals.js';
import { ClaimDatabase } from '../../lib/postgres/claim-database.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { BY_ID_SCOPE, claimStatementDeliveries } from '../support/claim-statement-deliveries.js';
import { CLAIM_SQL, PREPARE_TRANSACTION_CLAIM, statementNames } from '../support/claim-sql.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';

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
  const rounds: string[] = [];
  for (const text of sent) {
    if (/^\s*(ROLLBACK|COMMIT)\b/.test(text)) {
      rounds.push(text.trim());
      continue;
    }
    const parts: string[] = [];
    if (/^\s*BEGIN\b/.test(text)) parts.push('BEGIN');
    // The library's read of the session's prepared statements, after a miss (claimOnSession).
    if (text.includes('pg_prepared_statements WHERE name = ANY(')) parts.push('READ');
    if (text.includes(`PREPARE ${CLAIM_SQL.transactionClaim.name}`)) parts.push('PREPARE');
    if (text.includes(`EXECUTE ${CLAIM_SQL.transactionClaim.name}`)) parts.push('EXECUTE');
    if (parts.length === 0) continue;
    // A round sent as several queries (BEGIN, the read, the claim) is one entry; outside a round
    // (a test's own PREPARE) nothing is the library's claim. Only BEGIN opens a round: a nested
    // claim's (SAVEPOINT) would be folded into its transaction's, which no test here sends.
    if (parts[0] === 'BEGIN') rounds.push(parts.join('; '));
    else if (rounds.at(-1)?.startsWith('BEGIN')) rounds[rounds.length - 1] += `; ${parts.join('; ')}`;
  }
  return rounds;
}

/**
 * A connection's first claim prepares its statement and rolls back (it met the name already there,
 * a held lock, a handler that threw); then a delivery commits and its replay rolls back, both
 * EXECUTEing what the first one prepared.
 */
const ROLLED_BACK_THEN_DELIVERED_TWICE = [
  'BEGIN; PREPARE; EXECUTE',
  'ROLLBACK',
  'BEGIN; EXECUTE',
  'COMMIT',
  'BEGIN; EXECUTE',
  'ROLLBACK',
];

/** The one connection of a `poolSize: 1` app, with a recorder on it. */
async function onlyConnection(running: RunningApp): Promise<{ sent: string[] }> {
  const pool = pgPoolOf(running.app.get(DataSource));
  const client = await pool.connect();
  client.release();
  expect(pool.totalCount).toBe(1);
  return { sent: recordQueries(client) };
}

/**
 * The wire, exactly: the statements a delivery sends on its connection (BEGIN travelling with the
 * claim, PREPARE once per connection, EXECUTE after it, ROLLBACK or COMMIT), how that bookkeeping
 * recovers when the connection forgets its statements, and which statements each
 * `preparedStatements` setting leaves prepared. Behaviour specs assert effects and leave the trace
 * alone; this suite pins it, so a change in it is a deliberate one. Every case still asserts its
 * effects too, so a trace cannot pass on a delivery that went wrong.
 */
describe.each(onAdapter('express'))('the statements on the wire (%s)', (adapter) => {
  let db: TestDatabase;
  const { withApp, orders, claims, handled, deliverTwice, deliverAborted } = claimStatementDeliveries(
    adapter,
    () => db,
  );

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterAll(async () => {
    await db?.drop();
  });

  describe('preparedStatements', () => {
    // One pooled connection, so the statements it has prepared are the ones the claims sent.
    it.each<[boolean | 'auto', string[]]>([
      [true, statementNames('claimState', 'leaseClaim', 'leaseComplete', 'transactionClaim')],
      ['auto', statementNames('claimState', 'leaseClaim', 'leaseComplete', 'transactionClaim')],
      [false, []],
    ])('%s: both modes claim, replay and prepare exactly %j', async (preparedStatements, prepared) => {
      const running = await startApp(adapter, [
        WebhookFixtureModule.forDatabase({
          databaseUrl: db.url,
          poolSize: 1,
          idempotency: { preparedStatements },
        }),
      ]);
      try {
        for (const path of ['/orders', '/external']) {
          const id = `evt_prepared_${preparedStatements}_${adapter}_${path.slice(1)}`;
          expect((await request(running.url).post(path).send({ id })).status).toBe(200);
          const replay = await request(running.url).post(path).send({ id });
          expect(replay.status).toBe(200);
          expect(replay.headers['idempotent-replayed']).toBe('true');
          const table = path === '/orders' ? 'orders' : 'downstream_calls';
          expect(await db.count(`SELECT count(*) FROM ${table} WHERE event_id = $1`, [id])).toBe(1);
          expect(await db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1`, [id])).toBe(1);
        }
        const rows: { name: string }[] = await running.app
          .get(DataSource)
          .query(`SELECT name FROM pg_prepared_statements WHERE name LIKE 'idempotency_%' ORDER BY name`);
        expect(rows.map((row) => row.name)).toEqual(prepared);
      } finally {
        await running.close();
      }
    });
  });

  describe('prepared statement bookkeeping on a single pooled connection', () => {
    const preparedClaims = (running: RunningApp): Promise<{ name: string }[]> =>
      running.app
        .get(DataSource)
        .query(`SELECT name FROM pg_prepared_statements WHERE name LIKE 'idempotency_%' ORDER BY name`);
    /** What the transaction claim's PREPARE leaves: the claim and its companion (storeResponse's). */
    const TRANSACTION_CLAIM_PREPARED = statementNames('transactionClaim').map((name) => ({ name }));

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
        expect(await preparedClaims(running)).toEqual(TRANSACTION_CLAIM_PREPARED);

        // The connection forgets the statement; the module still believes it has it.
        await running.app.get(DataSource).query('DEALLOCATE ALL');
        expect(await preparedClaims(running)).toEqual([]);
        connection.sent.length = 0;
        const replay = await request(running.url).post('/claims/by-id').send({ id: firstId });
        expect(replay.status).toBe(200);
        expect(replay.headers['idempotent-replayed']).toBe('true');
        // The EXECUTE misses (26000); the round after reads what the connection has, and PREPAREs.
        expect(transactionControl(connection.sent)).toEqual([
          'BEGIN; EXECUTE',
          'ROLLBACK',
          'BEGIN; READ; PREPARE; EXECUTE',
          'ROLLBACK',
        ]);

        await running.app.get(DataSource).query('DEALLOCATE ALL');
        connection.sent.length = 0;
        const secondId = `evt_dealloc_2_${adapter}`;
        await deliverTwice(running, '/claims/by-id', secondId);
        expect(transactionControl(connection.sent)).toEqual([
          'BEGIN; EXECUTE',
          'ROLLBACK',
          'BEGIN; READ; PREPARE; EXECUTE',
          'COMMIT',
          'BEGIN; EXECUTE',
          'ROLLBACK',
        ]);

        for (const id of [firstId, secondId]) {
          expect(handled(running, 'by-id', id)).toBe(1);
          expect(await orders(id)).toBe(1);
          expect(await claims(id)).toBe(1);
        }
        expect(await preparedClaims(running)).toEqual(TRANSACTION_CLAIM_PREPARED);
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
        expect(await preparedClaims(running)).toEqual(TRANSACTION_CLAIM_PREPARED);

        const id = `evt_preprepared_${adapter}`;
        await deliverTwice(running, '/claims/by-id', id);
        // The first round's PREPAREs meet what is there (42P05); the round after reads the
        // connection, finds the claim and its companion, and EXECUTEs; the replay EXECUTEs at once.
        expect(transactionControl(connection.sent)).toEqual([
          'BEGIN; PREPARE; EXECUTE',
          'ROLLBACK',
          'BEGIN; READ; EXECUTE',
          'COMMIT',
          'BEGIN; EXECUTE',
          'ROLLBACK',
        ]);
        expect(handled(running, 'by-id', id)).toBe(1);
        expect(await orders(id)).toBe(1);
        expect(await claims(id)).toBe(1);
        expect(await preparedClaims(running)).toEqual(TRANSACTION_CLAIM_PREPARED);
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
        expect(await preparedClaims(running)).toEqual(TRANSACTION_CLAIM_PREPARED);

        await deliverTwice(running, '/claims/by-id', id);
        // The PREPARE ran before the claim timed out, and outlived the rollback: the next claim
        // EXECUTEs it straight away (no 42P05 miss, which 'auto' would count toward giving up).
        expect(transactionControl(connection.sent)).toEqual(ROLLED_BACK_THEN_DELIVERED_TWICE);
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
        expect(await preparedClaims(running)).toEqual(TRANSACTION_CLAIM_PREPARED);

        await deliverTwice(running, '/claims/throws-after-write', id);
        expect(transactionControl(connection.sent)).toEqual(ROLLED_BACK_THEN_DELIVERED_TWICE);
        expect(handled(running, 'throws-after-write', id)).toBe(2);
        expect(await orders(id)).toBe(1);
        expect(await claims(id)).toBe(1);
      });
    });
  });

  // A handler that catches a failed statement outside a savepoint and returns: Postgres answers
  // its COMMIT with a ROLLBACK (claim-statement.e2e-spec.ts asserts the answers and the effects).
  describe.each<[string, string, IdempotencyModuleOptions, string[]]>([
    ['default options', 'default', {}, ['BEGIN; PREPARE; EXECUTE', 'COMMIT', 'BEGIN; EXECUTE', 'COMMIT']],
    // Unprepared, BEGIN and the claim still travel together, the claim's values inlined.
    [
      'preparedStatements: false',
      'unprepared',
      { preparedStatements: false },
      ['BEGIN', 'COMMIT', 'BEGIN', 'COMMIT'],
    ],
  ])('after a COMMIT Postgres rolled back (%s)', (_label, tag, idempotency, control) => {
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
  });
});
