import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { IdempotencyKeyFixtureController } from '../fixtures/idempotency-key.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, lockWaiters, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';
import { pgBouncerPerFile, ROUTES, routeUrl } from '../support/database-routes.js';
import { waitUntil, within } from '../support/wait-until.js';

/** How long replica A's duplicates wait for the first request before their 409. */
const SHORT_WAIT_MS = 200;
/** Replica B's: long enough to see the first request commit while it waits. */
const LONG_WAIT_MS = 10_000;
/** No request of this file may take longer; a hang fails with the request named. */
const ANSWER_MS = 20_000;
/** The scope of the fixture's request-mode route (IdempotencyKeyFixtureController.pay). */
const PAY_SCOPE = 'IdempotencyKeyFixtureController.pay';
/** The stress test's keys, copies of each, and requests in flight at once. */
const KEYS = 40;
const COPIES = 3;
const IN_FLIGHT = 24;

/** Two replicas of the fixture's request-mode API on one database, and what the tests use of them. */
interface Replicas {
  db: TestDatabase;
  a: RunningApp;
  b: RunningApp;
}

/**
 * Starts, for the calling describe, a database (`prepare` runs on it first) and two apps on it
 * (two replicas, each its own pool), reached through `urlOf`, with `waitsMs` as their
 * concurrentDuplicateWaitMs; opens every gate after each test and stops them all after the last.
 */
function twoReplicas(
  waitsMs: readonly [number, number],
  urlOf: (db: TestDatabase) => string = (db) => db.url,
  prepare?: (db: TestDatabase) => Promise<unknown>,
): Replicas {
  const replicas = {} as Replicas;
  const replica = (waitMs: number) =>
    startApp(
      'express',
      [
        WebhookFixtureModule.forDatabase({
          databaseUrl: urlOf(replicas.db),
          idempotency: { concurrentDuplicateWaitMs: waitMs },
          controllers: [IdempotencyKeyFixtureController],
        }),
      ],
      { rawBody: true },
    );
  beforeAll(async () => {
    replicas.db = await createTestDatabase();
    await prepare?.(replicas.db);
    replicas.a = await replica(waitsMs[0]);
    replicas.b = await replica(waitsMs[1]);
  });
  afterEach(() => {
    replicas.a?.app.get(Gates).openAll();
    replicas.b?.app.get(Gates).openAll();
  });
  afterAll(async () => {
    await replicas.a?.close();
    await replicas.b?.close();
    await replicas.db?.drop();
  });
  return replicas;
}

/** A request-mode POST of `body` with `key` as user_a, bounded by ANSWER_MS. */
function pay(app: RunningApp, key: string, body: object) {
  return within(
    request(app.url)
      .post('/api/payments')
      .set('X-User', 'user_a')
      .set('Idempotency-Key', `"${key}"`)
      .send(body),
    ANSWER_MS,
    `the answer to key ${key} at ${app.url}`,
  );
}

/**
 * The first request for `key` runs at replica A and parks; a retry at replica B waits for it on the
 * key (`whileWaiting` runs then); once A goes on, both answer 201 and B replays A's answer.
 * Resolves with both answers for the caller's own assertions.
 */
async function retryWaitsAndReplays(
  { db, a, b }: Replicas,
  key: string,
  id: string,
  whileWaiting?: () => Promise<void>,
) {
  const first = pay(a, key, { id, block: true });
  await a.app.get(Gates).entered(id);
  const retry = pay(b, key, { id, block: true });
  await waitUntil(async () => (await lockWaiters(db)) === 1, 'replica B waiting on the key');
  await whileWaiting?.();
  a.app.get(Gates).open(id);
  const [firstAnswer, retryAnswer] = await Promise.all([first, retry]);
  expect(firstAnswer.status).toBe(201);
  expect(retryAnswer.status).toBe(201);
  expect(retryAnswer.headers['idempotent-replayed']).toBe('true');
  expect(retryAnswer.body).toEqual(firstAnswer.body);
  return [firstAnswer, retryAnswer] as const;
}

/**
 * The request mode's claim across replicas: a request-mode delivery in transaction mode writes
 * its claim row at its COMMIT, with its response (ClaimStatements.claimAtCommit), and holds the
 * key meanwhile with an advisory lock. Two apps (two replicas, each its own pool) on one
 * database, straight and through PgBouncer in transaction mode; each test asserts the effect
 * (order rows, claim rows), not only the status. On one platform: the claim is the database's,
 * and the conformance suite runs both platforms.
 */
describe.each(ROUTES)('Idempotency-Key across replicas (%s)', (route) => {
  const pooler = pgBouncerPerFile({ poolSize: 6 });
  const replicas = twoReplicas([SHORT_WAIT_MS, LONG_WAIT_MS], (db) => routeUrl(route, db, pooler));
  let db: TestDatabase;
  let a: RunningApp;
  let b: RunningApp;
  beforeAll(() => {
    ({ db, a, b } = replicas);
  });

  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const claim = async (key: string) =>
    (
      await db.pool.query(`SELECT scope, status, response FROM processed_events WHERE event_key = $1`, [
        `user_a:${key}`,
      ])
    ).rows;
  /** Advisory locks on the database, `granted` or waited for. */
  const advisoryLocks = (granted: boolean) =>
    db.count(
      `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
       WHERE l.locktype = 'advisory' AND l.granted = $1 AND d.datname = $2`,
      [granted, db.name],
    );
  /**
   * Whether a claim row for `key` of `scope` is there, committed or not: another session's insert
   * of it finds a committed one, or waits on an uncommitted one until its lock_timeout (55P03).
   * Rolled back either way.
   */
  const claimRowThere = async (scope: string, key: string) => {
    const probe = await db.pool.connect();
    try {
      await probe.query('BEGIN');
      await probe.query(`SET LOCAL lock_timeout = '200ms'`);
      const inserted = await probe.query(
        `INSERT INTO processed_events (scope, event_key, source, status, completed_at)
         VALUES ($1, $2, 'probe', 'done', now()) ON CONFLICT DO NOTHING`,
        [scope, `user_a:${key}`],
      );
      return inserted.rowCount === 0;
    } catch (error) {
      if ((error as { code?: string }).code === '55P03') return true;
      throw error;
    } finally {
      await probe.query('ROLLBACK');
      probe.release();
    }
  };

  it('holds the key with a lock while the first runs and writes its claim row, with the response, at the COMMIT', async () => {
    const id = `ord_locked_${route}`;
    const key = `8e03978e-locked-${route}`;
    const first = pay(a, key, { id, block: true });
    await a.app.get(Gates).entered(id);
    expect(await advisoryLocks(true)).toBe(1);
    expect(await claimRowThere(PAY_SCOPE, key)).toBe(false);
    a.app.get(Gates).open(id);
    const answer = await first;
    expect(answer.status).toBe(201);
    expect(await advisoryLocks(true)).toBe(0);
    expect(await claimRowThere(PAY_SCOPE, key)).toBe(true);
    expect(await claim(key)).toEqual([
      expect.objectContaining({
        scope: PAY_SCOPE,
        status: 'done',
        response: expect.objectContaining({ status: 201, json: answer.text }),
      }),
    ]);
    expect(await orders(id)).toBe(1);
  });

  it('a retry at another replica waits on the lock, then replays what the first committed meanwhile', async () => {
    const id = `ord_waited_${route}`;
    const key = `8e03978e-waited-${route}`;
    // The lock B waits on is the key's advisory lock, not a claim row's.
    const [firstAnswer, retryAnswer] = await retryWaitsAndReplays(replicas, key, id, async () => {
      expect(await advisoryLocks(false)).toBe(1);
    });
    expect(retryAnswer.headers.location).toBe(firstAnswer.headers.location);
    expect(await orders(id)).toBe(1);
    expect(await claim(key)).toHaveLength(1);
  });

  it('a retry at another replica that outwaits its bound is 409, runs nothing, and replays once the first is done', async () => {
    const id = `ord_outwaited_${route}`;
    const key = `8e03978e-outwaited-${route}`;
    const first = pay(b, key, { id, block: true });
    await b.app.get(Gates).entered(id);
    const retry = await pay(a, key, { id, block: true });
    expect(retry.status).toBe(409);
    expect(Number(retry.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    b.app.get(Gates).open(id);
    expect((await first).status).toBe(201);
    const later = await pay(a, key, { id, block: true });
    expect(later.status).toBe(201);
    expect(later.headers['idempotent-replayed']).toBe('true');
    expect(await orders(id)).toBe(1);
  });

  it('a claim row another writer commits while the request runs wins: its writes roll back and it answers from that row', async () => {
    const id = `ord_taken_${route}`;
    const key = `8e03978e-taken-${route}`;
    // The route's scope, from a request of its own.
    const probe = `8e03978e-probe-${route}`;
    expect((await pay(a, probe, { id: `${id}_probe` })).status).toBe(201);
    const [{ scope }] = await claim(probe);

    const logs = new LogCapture();
    a.app.useLogger(logs);
    const first = pay(a, key, { id, block: true });
    await a.app.get(Gates).entered(id);
    // A writer that takes no lock (a release that claims first, a claim of the other mode):
    // its claim row, uncommitted, then committed once the request's COMMIT waits on it. Its
    // response is in the shape an earlier release stores (a jsonb body), which replays too.
    const other = await db.pool.connect();
    try {
      await other.query('BEGIN');
      await other.query(
        `INSERT INTO processed_events (scope, event_key, source, status, completed_at, response)
         VALUES ($1, $2, 'api', 'done', now(), $3)`,
        [
          scope,
          `user_a:${key}`,
          { status: 201, headers: { location: '/api/payments/other' }, body: { id: 'other' } },
        ],
      );
      a.app.get(Gates).open(id);
      await waitUntil(
        async () => (await lockWaiters(db)) === 1,
        "the request's COMMIT waiting on the other claim",
      );
      await other.query('COMMIT');
    } finally {
      other.release();
    }
    const answer = await first;
    expect(answer.status).toBe(201);
    expect(answer.headers['idempotent-replayed']).toBe('true');
    expect(answer.body).toEqual({ id: 'other' });
    expect(answer.headers.location).toBe('/api/payments/other');
    expect(await orders(id)).toBe(0);
    expect(await claim(key)).toMatchObject([{ status: 'done', response: { body: { id: 'other' } } }]);
    // Its transaction rolled back and the delivery ran again, from its claim: said at debug level.
    expect(logs.find('debug', key, 'runs again (try 2 of 3)')).toHaveLength(1);
  });

  it("a claim another writer commits before the handler's own write meets it: the handler's failure is that writer's success, replayed, not a 500", async () => {
    const id = `ord_met_${route}`;
    const key = `8e03978e-met-${route}`;
    const logs = new LogCapture();
    a.app.useLogger(logs);
    // A delivery that committed the key between the request's snapshot and its lock, as seen
    // from the request: its claim row and its order, uncommitted while the request claims.
    const other = await db.pool.connect();
    let answer: Awaited<ReturnType<typeof pay>>;
    try {
      await other.query('BEGIN');
      await other.query(
        `INSERT INTO processed_events (scope, event_key, source, status, completed_at, response)
         VALUES ($1, $2, 'api', 'done', now(), $3)`,
        [PAY_SCOPE, `user_a:${key}`, { status: 201, headers: {}, body: { id: 'other' } }],
      );
      await other.query('INSERT INTO orders (event_id, amount) VALUES ($1, 7)', [id]);
      // The request claims (its lock is free, the row not yet visible) and its own order waits
      // on the other's, on the orders table's unique event id.
      const first = pay(a, key, { id });
      await waitUntil(
        async () => (await lockWaiters(db)) === 1,
        "the handler's insert waiting on the other's",
      );
      await other.query('COMMIT');
      answer = await first;
    } finally {
      other.release();
    }
    expect([answer.status, answer.headers['idempotent-replayed'], answer.body]).toEqual([
      201,
      'true',
      { id: 'other' },
    ]);
    expect(await orders(id)).toBe(1);
    expect(await claim(key)).toMatchObject([{ status: 'done', response: { body: { id: 'other' } } }]);
    expect(
      logs.find('debug', key, 'runs again (try 2 of 3)', 'found its row written meanwhile'),
    ).toHaveLength(1);
    expect(logs.find('error')).toEqual([]);
  });

  it('a duplicate of another unique index of the claims table is no taken claim: the request runs once and fails, and writes nothing', async () => {
    const key = (n: number) => `8e03978e-unique-${route}-${n}`;
    // An index a user added: two of this test's claims may not store the same status.
    await db.pool.query(
      `CREATE UNIQUE INDEX processed_events_one_status_${route} ON processed_events ((response->>'status'))
       WHERE event_key LIKE 'user_a:8e03978e-unique-${route}-%'`,
    );
    try {
      expect((await pay(a, key(1), { id: `ord_unique_${route}_1` })).status).toBe(201);
      const runs = () => db.count('SELECT last_value FROM orders_id_seq');
      const before = await runs();
      const answer = await pay(a, key(2), { id: `ord_unique_${route}_2` });
      // The handler ran once (one id drawn), not again as if its claim had been taken.
      expect(await runs()).toBe(before + 1);
      expect(answer.status).toBe(500);
      expect(answer.headers['idempotent-replayed']).toBeUndefined();
      expect(await orders(`ord_unique_${route}_2`)).toBe(0);
      expect(await claim(key(2))).toEqual([expect.objectContaining({ status: 'failed', response: null })]);
    } finally {
      await db.pool.query(`DROP INDEX processed_events_one_status_${route}`);
    }
  });

  it(`${KEYS} keys sent ${COPIES} times each, spread over both replicas, ${IN_FLIGHT} in flight: each runs once, every copy answers its response or 409`, async () => {
    const sends: { key: string; id: string; app: RunningApp }[] = [];
    for (let copy = 0; copy < COPIES; copy++) {
      for (let n = 0; n < KEYS; n++) {
        const key = `8e03978e-stress-${route}-${n}`;
        sends.push({ key, id: `ord_stress_${route}_${n}`, app: (n + copy) % 2 === 0 ? a : b });
      }
    }
    // Every run of the handler draws an order id, rolled back or not. A delivery may run again only
    // when a claim at commit's snapshot missed the holder's COMMIT (its own COMMIT meets the row),
    // and each rerun says why in a debug line: those are counted, and any other (a statement the
    // COMMIT missed on a pooled session) fails the test. The logger is process-wide: both
    // replicas write to it.
    const logs = new LogCapture();
    a.app.useLogger(logs);
    const handlerRuns = async () => {
      const { rows } = await db.pool.query<{ last_value: string; is_called: boolean }>(
        'SELECT last_value, is_called FROM orders_id_seq',
      );
      return rows[0].is_called ? Number(rows[0].last_value) : 0;
    };
    const runsBefore = await handlerRuns();
    const answers: { key: string; status: number; replayed: boolean; body: unknown }[] = [];
    let next = 0;
    const sender = async () => {
      while (next < sends.length) {
        const { key, id, app } = sends[next++];
        const answer = await pay(app, key, { id, amount: 7 });
        answers.push({
          key,
          status: answer.status,
          replayed: answer.headers['idempotent-replayed'] === 'true',
          body: answer.body,
        });
      }
    };
    await Promise.all(Array.from({ length: IN_FLIGHT }, sender));

    // With what the library logged as errors, so that a failure here says why.
    expect({
      unexpected: answers.filter((answer) => answer.status !== 201 && answer.status !== 409),
      errors: logs.find('error'),
    }).toEqual({ unexpected: [], errors: [] });
    const reruns = logs.find('debug', `8e03978e-stress-${route}-`, 'runs again');
    const taken = 'found its row written meanwhile';
    expect(reruns.filter((line) => !line.message.includes(taken))).toEqual([]);
    expect((await handlerRuns()) - runsBefore).toBe(KEYS + reruns.length);
    const firsts = new Map<string, unknown>();
    for (const answer of answers) {
      if (answer.status !== 201 || answer.replayed) continue;
      expect(firsts.has(answer.key)).toBe(false);
      firsts.set(answer.key, answer.body);
    }
    // Every key again, now that none runs: each replays the one response its first stored.
    for (let n = 0; n < KEYS; n++) {
      const key = `8e03978e-stress-${route}-${n}`;
      const again = await pay(n % 2 === 0 ? b : a, key, { id: `ord_stress_${route}_${n}`, amount: 7 });
      expect(again.status).toBe(201);
      expect(again.headers['idempotent-replayed']).toBe('true');
      if (firsts.has(key)) expect(again.body).toEqual(firsts.get(key));
      else firsts.set(key, again.body);
    }
    for (const answer of answers) {
      if (answer.status === 201 && answer.replayed) expect(answer.body).toEqual(firsts.get(answer.key));
    }
    const { rows } = await db.pool.query<{ event_id: string; count: string }>(
      `SELECT event_id, count(*) FROM orders WHERE event_id LIKE $1 GROUP BY event_id`,
      [`ord\\_stress\\_${route}\\_%`],
    );
    expect(rows).toHaveLength(KEYS);
    expect(rows.filter((row) => row.count !== '1')).toEqual([]);
    expect(
      await db.count(`SELECT count(*) FROM processed_events WHERE event_key LIKE $1 AND status = 'done'`, [
        `user\\_a:8e03978e-stress-${route}-%`,
      ]),
    ).toBe(KEYS);
  }, 120_000);
});

/**
 * A database whose transactions default to REPEATABLE READ (`default_transaction_isolation`, set
 * where the app cannot see it): a claim at commit that waits for the key cannot read the holder's
 * commit in its snapshot, so it starts its transaction again, and replays.
 */
describe('Idempotency-Key across replicas, REPEATABLE READ by default', () => {
  const replicas = twoReplicas([LONG_WAIT_MS, LONG_WAIT_MS], undefined, (db) =>
    db.pool.query(`ALTER DATABASE ${db.name} SET default_transaction_isolation = 'repeatable read'`),
  );

  it('a retry at another replica waits on the lock, starts again and replays what the first committed', async () => {
    const id = 'ord_repeatable';
    const key = '8e03978e-repeatable';
    const { db } = replicas;
    await retryWaitsAndReplays(replicas, key, id);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(1);
  });
});
