import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import request from 'supertest';
import type { ClaimOutcomeEvent } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { CLAIM_SQL } from '../support/claim-sql.js';
import {
  DatabaseFailuresFixtureModule,
  FAILURE_RETRY_AFTER_SECONDS,
  FAILURES_SCHEMA,
  HandlerRuns,
} from '../fixtures/database-failures.fixture.js';
import { Gates } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls, leaseExpired } from '../support/lease-rows.js';
import { LogCapture } from '../support/log-capture.js';
import { parkDelivery } from '../support/parked-delivery.js';
import {
  startTcpProxy,
  type ClientStatement,
  type CutMoment,
  type CutRule,
  type TcpProxy,
} from '../support/tcp-proxy.js';
import { waitUntil } from '../support/wait-until.js';

const ORDER = 'FailuresController.order';
const EXTERNAL = 'FailuresController.external';
const SHORT_LEASE = 'FailuresController.externalShortLease';
const COUNTER = 'FailuresController.counter';
const RETRY_AFTER = String(FAILURE_RETRY_AFTER_SECONDS);
/** pg_terminate_backend's SQLSTATE, admin_shutdown. */
const ADMIN_SHUTDOWN = '57P01';

/**
 * The database failing in the middle of a delivery, made real: the apps reach Postgres through a
 * TcpProxy that cuts a connection as a chosen statement goes by, and the tests terminate backends
 * with pg_terminate_backend. Every failure is answered 503 + Retry-After (the sender retries),
 * never 500 and never 200 for work that did not commit, and the redelivery settles it: processed
 * once if nothing committed, replayed if it did. Effects are read through the test's own pool,
 * which does not go through the proxy.
 */
describe.each(onAdapter('express'))('database failures during a delivery (%s)', (adapter) => {
  let db: TestDatabase;
  let proxy: TcpProxy;
  let running: RunningApp;
  let gates: Gates;
  /** A second app, its DataSource at SERIALIZABLE, for the serialization failure. */
  let serializable: RunningApp;
  let serializableGates: Gates;
  const outcomeEvents: ClaimOutcomeEvent[] = [];
  const logs = new LogCapture();
  const rules: CutRule[] = [];
  const lockHolders: pg.PoolClient[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(FAILURES_SCHEMA);
    const target = new URL(db.url);
    proxy = await startTcpProxy(target.hostname, Number(target.port));
    running = await startApp(adapter, [
      DatabaseFailuresFixtureModule.forDatabase({ databaseUrl: proxy.url(db.url) }),
    ]);
    gates = running.app.get(Gates);
    serializable = await startApp(adapter, [
      DatabaseFailuresFixtureModule.forDatabase({
        databaseUrl: proxy.url(db.url),
        isolationLevel: 'SERIALIZABLE',
        idempotency: { onOutcome: (event) => void outcomeEvents.push(event) },
      }),
    ]);
    serializableGates = serializable.app.get(Gates);
    // Nest's logger is process-wide and each startApp resets it: install the capture last.
    running.app.useLogger(logs);
  });

  beforeEach(() => logs.clear());

  afterEach(async () => {
    // A failed assertion must leave no rule armed, no handler parked and no lock held.
    for (const rule of rules.splice(0)) rule.cancel();
    gates?.openAll();
    serializableGates?.openAll();
    for (const client of lockHolders.splice(0)) {
      await client.query('SELECT pg_advisory_unlock_all()');
      client.release();
    }
  });

  afterAll(async () => {
    await running?.close();
    await serializable?.close();
    await proxy?.close();
    await db?.drop();
  });

  /** Arms a cut; afterEach disarms it if it never fired. */
  const cutWhen = (...args: Parameters<TcpProxy['cutWhen']>) => {
    const rule = proxy.cutWhen(...args);
    rules.push(rule);
    return rule;
  };
  /**
   * The cuts of `made`, every one of which must have fired by the time the delivery was answered:
   * the library answers after its last statement, and a cut completes before the app hears of it.
   * Checked, not awaited blindly, so a rule that never fired fails the test instead of hanging it.
   */
  const cutsMade = (...made: CutRule[]) => {
    expect(made.map((rule) => rule.fired)).toEqual(made.map(() => true));
    return Promise.all(made.map((rule) => rule.done));
  };
  /** The statement sent on the same connection just before `statement`. */
  const previousOn = (statement: ClientStatement) =>
    proxy.statements.filter((sent) => sent.connection === statement.connection).at(-1);
  /** Starts a delivery without awaiting it (supertest only sends once `then` is called). */
  const deliver = (app: RunningApp, path: string, body: Record<string, unknown>) =>
    request(app.url)
      .post(path)
      .send(body)
      .then((answer) => answer);
  const orders = (id: string) =>
    db.pool
      .query<{ amount: number }>('SELECT amount FROM orders WHERE event_id = $1', [id])
      .then(({ rows }) => rows);
  // Claims that committed: a handler's failure leaves a failed record, which claims nothing.
  const claims = (id: string) =>
    db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [id]);
  const outcomes = (app: RunningApp, scope: string) =>
    app.app.get(IdempotencyMetrics).snapshot().claims[scope] ?? {};
  const runsOf = (app: RunningApp, id: string) => app.app.get(HandlerRuns).runsOf(id);

  /** The answer of a delivery the database failed under: 503 + the configured Retry-After. */
  const expectUnavailable = (answer: request.Response, id: string) => {
    expect(answer.status).toBe(503);
    expect(answer.headers['retry-after']).toBe(RETRY_AFTER);
    expect(answer.body.message).toBe(
      `Could not record event ${id}: the database is unavailable; retry later`,
    );
  };

  /** Holds advisory lock `key` on a connection of the test's own, until afterEach. */
  const holdLock = async (key: number) => {
    const client = await db.pool.connect();
    lockHolders.push(client);
    await client.query('SELECT pg_advisory_lock($1)', [key]);
  };
  /** The backend of the delivery parked on `pg_advisory_xact_lock`, once it waits there. */
  const backendWaitingOnLock = async () => {
    let pid: number | undefined;
    await waitUntil(async () => {
      const { rows } = await db.pool.query<{ pid: number }>(
        `SELECT pid FROM pg_stat_activity
         WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%pg_advisory_xact_lock%'
           AND pid <> pg_backend_pid()`,
        [db.name],
      );
      pid = rows.length === 1 ? rows[0].pid : undefined;
      return pid !== undefined;
    }, 'the handler to wait on the advisory lock');
    return pid!;
  };
  const terminate = async (pid: number) => {
    const { rows } = await db.pool.query<{ done: boolean }>('SELECT pg_terminate_backend($1) AS done', [pid]);
    expect(rows[0].done).toBe(true);
  };

  it('answers 503 + Retry-After, not 500, when the ROLLBACK after a claim that found the event done fails', async () => {
    const id = `evt_replay_rollback_${adapter}`;
    expect((await deliver(running, '/failures/orders', { id })).status).toBe(200);
    const before = outcomes(running, ORDER);

    // The replay path: the claim finds the key done, and the ROLLBACK that ends its transaction
    // never reaches the server.
    const cut = cutWhen(
      (sql, statement) =>
        sql === 'ROLLBACK' &&
        previousOn(statement)?.text.includes(`EXECUTE ${CLAIM_SQL.transactionClaim.name}`) === true,
    );
    const duplicate = await deliver(running, '/failures/orders', { id });
    expectUnavailable(duplicate, id);
    const [made] = await cutsMade(cut);
    expect(made.statement.text).toBe('ROLLBACK');
    expect(logs.find('error', `Claim of ${ORDER} key ${id} failed`)).toHaveLength(1);
    // Not counted as a replay: it was not answered as one.
    expect(outcomes(running, ORDER)).toEqual(before);

    expect(await orders(id)).toEqual([{ amount: 2 }]);
    expect(await claimRow(db, ORDER, id)).toMatchObject({ status: 'done', attempts: 1 });
    const redelivered = await deliver(running, '/failures/orders', { id });
    expect(redelivered.status).toBe(200);
    expect(redelivered.headers['idempotent-replayed']).toBe('true');
    expect(runsOf(running, id)).toBe(1);
  });

  it('answers 503 + Retry-After when the connection is cut during the handler’s INSERT; nothing is written and the redelivery processes once', async () => {
    const id = `evt_cut_insert_${adapter}`;
    const cut = cutWhen(
      (sql, statement) => sql.startsWith('INSERT INTO orders') && statement.parameters[0] === id,
    );
    const answer = await deliver(running, '/failures/orders', { id });
    expectUnavailable(answer, id);
    await cutsMade(cut);
    expect(logs.find('error', `Handler of ${ORDER} key ${id} lost the database`)).toHaveLength(1);
    expect(await orders(id)).toEqual([]);
    expect(await claims(id)).toBe(0);

    const redelivered = await deliver(running, '/failures/orders', { id });
    expect(redelivered.status).toBe(200);
    expect(redelivered.body).toEqual({ processed: id });
    expect(redelivered.headers['idempotent-replayed']).toBeUndefined();
    expect(await orders(id)).toEqual([{ amount: 2 }]);
    expect(await claimRow(db, ORDER, id)).toMatchObject({ status: 'done', attempts: 1 });
    expect(runsOf(running, id)).toBe(2);
  });

  it('answers 503 + Retry-After when the backend of a handler waiting in Postgres is terminated (57P01), in transaction mode', async () => {
    const id = `evt_terminated_tx_${adapter}`;
    const lockKey = 7_001 + ADAPTERS.indexOf(adapter);
    await holdLock(lockKey);
    const answer = deliver(running, '/failures/orders', { id, lockKey });
    await terminate(await backendWaitingOnLock());

    expectUnavailable(await answer, id);
    expect(running.app.get(HandlerRuns).errorsOf(id)).toEqual([ADMIN_SHUTDOWN]);
    expect(
      logs.find('error', `Handler of ${ORDER} key ${id} lost the database (SQLSTATE ${ADMIN_SHUTDOWN})`),
    ).toHaveLength(1);
    expect(await orders(id)).toEqual([]);
    expect(await claims(id)).toBe(0);

    // The same delivery again, its lock free now: processed once.
    await lockHolders[0].query('SELECT pg_advisory_unlock($1)', [lockKey]);
    const redelivered = await deliver(running, '/failures/orders', { id, lockKey });
    expect(redelivered.status).toBe(200);
    expect(redelivered.headers['idempotent-replayed']).toBeUndefined();
    expect(await orders(id)).toEqual([{ amount: 2 }]);
    expect(await claimRow(db, ORDER, id)).toMatchObject({ status: 'done', attempts: 1 });
  });

  it('answers 503 + Retry-After when the backend of a handler parked at its gate (idle in transaction) is terminated', async () => {
    const id = `evt_terminated_idle_${adapter}`;
    const { answer } = await parkDelivery(running, '/failures/orders', { id });
    const { rows } = await db.pool.query<{ pid: number }>(
      `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND state = 'idle in transaction'`,
      [db.name],
    );
    expect(rows).toHaveLength(1);
    await terminate(rows[0].pid);
    await waitUntil(
      async () =>
        (await db.count('SELECT count(*) FROM pg_stat_activity WHERE pid = $1', [rows[0].pid])) === 0,
      'the terminated backend to exit',
    );

    // The handler's next statement meets the lost connection.
    gates.open(id);
    expectUnavailable(await answer, id);
    expect(logs.find('error', `Handler of ${ORDER} key ${id} lost the database`)).toHaveLength(1);
    expect(await orders(id)).toEqual([]);
    expect(await claims(id)).toBe(0);

    const redelivered = await deliver(running, '/failures/orders', { id });
    expect(redelivered.status).toBe(200);
    expect(redelivered.headers['idempotent-replayed']).toBeUndefined();
    expect(await orders(id)).toEqual([{ amount: 2 }]);
  });

  it('answers 503 + Retry-After when the connection is cut during an external handler’s INSERT; the lease is marked failed and the redelivery re-claims', async () => {
    const id = `evt_cut_external_${adapter}`;
    const before = outcomes(running, EXTERNAL);
    const cut = cutWhen(
      (sql, statement) => sql.startsWith('INSERT INTO downstream_calls') && statement.parameters[0] === id,
    );
    const answer = await deliver(running, '/failures/external', { id });
    expectUnavailable(answer, id);
    await cutsMade(cut);
    expect(logs.find('error', `Handler of ${EXTERNAL} key ${id} lost the database`)).toHaveLength(1);
    expect(await downstreamCalls(db, id)).toEqual([]);
    const failed = await claimRow(db, EXTERNAL, id);
    expect(failed).toMatchObject({ status: 'failed', attempts: 1 });
    expect(failed?.last_error).toEqual(expect.any(String));

    const redelivered = await deliver(running, '/failures/external', { id });
    expect(redelivered.status).toBe(200);
    expect(redelivered.body).toEqual({ processed: id, attempt: 2 });
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({ status: 'done', attempts: 2 });
    expect(outcomes(running, EXTERNAL)).toEqual({
      ...before,
      claimed: (before.claimed ?? 0) + 1,
      failed: (before.failed ?? 0) + 1,
      reclaimed: (before.reclaimed ?? 0) + 1,
    });
  });

  it('answers 503 + Retry-After when the backend of an external handler waiting in Postgres is terminated (57P01); the redelivery re-claims', async () => {
    const id = `evt_terminated_external_${adapter}`;
    const lockKey = 7_101 + ADAPTERS.indexOf(adapter);
    await holdLock(lockKey);
    const answer = deliver(running, '/failures/external', { id, lockKey });
    await terminate(await backendWaitingOnLock());

    expectUnavailable(await answer, id);
    expect(running.app.get(HandlerRuns).errorsOf(id)).toEqual([ADMIN_SHUTDOWN]);
    expect(
      logs.find('error', `Handler of ${EXTERNAL} key ${id} lost the database (SQLSTATE ${ADMIN_SHUTDOWN})`),
    ).toHaveLength(1);
    expect(await downstreamCalls(db, id)).toEqual([]);
    // Marked failed at once (the mark's first send may meet the dying connection; it is sent again).
    expect(logs.find('error', 'Could not mark')).toEqual([]);
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({
      status: 'failed',
      attempts: 1,
      last_error: 'terminating connection due to administrator command',
    });

    await lockHolders[0].query('SELECT pg_advisory_unlock($1)', [lockKey]);
    const redelivered = await deliver(running, '/failures/external', { id, lockKey });
    expect(redelivered.status).toBe(200);
    expect(redelivered.body).toEqual({ processed: id, attempt: 2 });
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
  });

  /** Cuts the handler's side effect of `id`, so its external handler fails with a lost connection. */
  const cutSideEffect = (id: string) =>
    cutWhen(
      (sql, statement) => sql.startsWith('INSERT INTO downstream_calls') && statement.parameters[0] === id,
    );
  /** Cuts a send of the fenced failure mark of `id` (LEASE_FAIL: scope, key, token, error). */
  const cutFailureMark = (id: string, when: CutMoment) =>
    cutWhen(
      (_sql, statement) =>
        statement.statementName === CLAIM_SQL.leaseFail.name && statement.parameters[1] === id,
      { when },
    );

  it('sends the failure mark again when its connection is lost, so the redelivery re-claims at once', async () => {
    const id = `evt_mark_resent_${adapter}`;
    const before = outcomes(running, EXTERNAL);
    cutSideEffect(id);
    const mark = cutFailureMark(id, 'before-forward');
    expectUnavailable(await deliver(running, '/failures/external', { id }), id);
    await cutsMade(mark);
    expect(logs.find('error', 'Could not mark')).toEqual([]);
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({ status: 'failed', attempts: 1 });
    expect(outcomes(running, EXTERNAL)).toEqual({
      ...before,
      claimed: (before.claimed ?? 0) + 1,
      failed: (before.failed ?? 0) + 1,
    });

    const redelivered = await deliver(running, '/failures/external', { id });
    expect(redelivered.body).toEqual({ processed: id, attempt: 2 });
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
  });

  it('counts a failure mark that ran but whose answer was lost as the failure, not as a lost lease', async () => {
    const id = `evt_mark_ran_${adapter}`;
    const before = outcomes(running, EXTERNAL);
    cutSideEffect(id);
    // The first mark runs; its answer is lost, and the second send then matches nothing.
    const mark = cutFailureMark(id, 'after-forward');
    expectUnavailable(await deliver(running, '/failures/external', { id }), id);
    await cutsMade(mark);
    expect(logs.find('error', 'Lease lost')).toEqual([]);
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({ status: 'failed', attempts: 1 });
    expect(outcomes(running, EXTERNAL)).toEqual({
      ...before,
      claimed: (before.claimed ?? 0) + 1,
      failed: (before.failed ?? 0) + 1,
    });
    expect((await deliver(running, '/failures/external', { id })).body).toEqual({
      processed: id,
      attempt: 2,
    });
  });

  it('goes on sending the failure mark after the answer while the database is away, so the redelivery re-claims at once', async () => {
    const id = `evt_mark_later_${adapter}`;
    const handlerCut = cutSideEffect(id);
    // The mark's first three sends (StatementExecutor.executeResending) all fail: the answer goes
    // out, and the mark keeps being sent until it lands, well within the five-minute lease.
    const marks = [1, 2, 3].map(() => cutFailureMark(id, 'before-forward'));
    expectUnavailable(await deliver(running, '/failures/external', { id }), id);
    await cutsMade(handlerCut, ...marks);
    expect(logs.find('warn', `Could not mark ${id} (${EXTERNAL}) failed yet`)).toHaveLength(1);
    await waitUntil(
      async () => (await claimRow(db, EXTERNAL, id))?.status === 'failed',
      'the failure mark sent after the answer to land',
    );
    expect(logs.find('error', 'Could not mark')).toEqual([]);

    // Not held for the rest of the lease: the next delivery takes the event at once.
    const redelivered = await deliver(running, '/failures/external', { id });
    expect(redelivered.status).toBe(200);
    expect(redelivered.body).toEqual({ processed: id, attempt: 2 });
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
  });

  it('gives the failure mark up once the lease has run out: the row expires and the redelivery re-claims', async () => {
    const id = `evt_mark_lost_${adapter}`;
    const handlerCut = cutSideEffect(id);
    // More cuts than the mark can be sent within the 1.5 s lease: every send fails.
    const marks = Array.from({ length: 60 }, () => cutFailureMark(id, 'before-forward'));
    expectUnavailable(await deliver(running, '/failures/external/short-lease', { id }), id);
    await cutsMade(handlerCut, marks[0]);
    await waitUntil(
      () => logs.find('error', `Could not mark ${SHORT_LEASE} key ${id} failed`).length === 1,
      'the failure mark to be given up',
    );
    // Sent in rounds until the lease ran out, then left: the row stays in_progress and expires.
    expect(marks.filter((mark) => mark.fired).length).toBeGreaterThan(3);
    for (const mark of marks) mark.cancel();
    expect(await claimRow(db, SHORT_LEASE, id)).toMatchObject({ status: 'in_progress', attempts: 1 });
    expect(await downstreamCalls(db, id)).toEqual([]);

    await waitUntil(() => leaseExpired(db, SHORT_LEASE, id), 'the lease to expire');
    const redelivered = await deliver(running, '/failures/external/short-lease', { id });
    expect(redelivered.status).toBe(200);
    expect(redelivered.body).toEqual({ processed: id, attempt: 2 });
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
    expect(await claimRow(db, SHORT_LEASE, id)).toMatchObject({ status: 'done', attempts: 2 });
  });

  it('answers an ambiguous COMMIT 503 + Retry-After and logs it; the commit happened, so the redelivery is replayed', async () => {
    const id = `evt_ambiguous_commit_${adapter}`;
    // The COMMIT reaches the server and commits; the answer never reaches the app.
    const cut = cutWhen((sql) => sql === 'COMMIT', { when: 'after-forward' });
    const answer = await deliver(running, '/failures/orders', { id });
    expectUnavailable(answer, id);
    const [made] = await cutsMade(cut);
    expect(made.when).toBe('after-forward');
    const ambiguous = logs.find(
      'error',
      `COMMIT of ${ORDER} key ${id} may have committed; the redelivery will tell`,
    );
    expect(ambiguous).toHaveLength(1);

    expect(await orders(id)).toEqual([{ amount: 2 }]);
    expect(await claimRow(db, ORDER, id)).toMatchObject({ status: 'done', attempts: 1 });
    const redelivered = await deliver(running, '/failures/orders', { id });
    expect(redelivered.status).toBe(200);
    expect(redelivered.headers['idempotent-replayed']).toBe('true');
    expect(await orders(id)).toEqual([{ amount: 2 }]);
    expect(runsOf(running, id)).toBe(1);
  });

  it('counts a delivery retried after a serialization failure claimed once, never failed', async () => {
    const counter = `counter_${adapter}`;
    await db.pool.query('INSERT INTO counters (name, value) VALUES ($1, 0)', [counter]);
    const [idA, idB] = [`evt_serial_a_${adapter}`, `evt_serial_b_${adapter}`];
    const before = outcomes(serializable, COUNTER);

    // Both read the counter, then park; A writes and commits first, so B's write of the row A
    // changed after B's snapshot fails with 40001, and the strategy runs B again from scratch.
    const a = await parkDelivery(serializable, '/failures/counter', { id: idA, counter });
    const b = await parkDelivery(serializable, '/failures/counter', { id: idB, counter });
    serializableGates.open(idA);
    expect((await a.answer).body).toEqual({ processed: idA, run: 1 });
    serializableGates.open(idB);
    const answerB = await b.answer;
    expect(answerB.status).toBe(200);
    expect(answerB.body).toEqual({ processed: idB, run: 2 });

    const runs = serializable.app.get(HandlerRuns);
    expect(runs.errorsOf(idB)).toEqual(['40001']);
    expect(runs.errorsOf(idA)).toEqual([]);
    expect((await db.pool.query('SELECT value FROM counters WHERE name = $1', [counter])).rows[0].value).toBe(
      2,
    );
    expect(await claims(idA)).toBe(1);
    expect(await claims(idB)).toBe(1);
    // One outcome per delivery: B's failed first try is not counted.
    expect(outcomeEvents.filter((event) => event.key === idB).map((event) => event.outcome)).toEqual([
      'claimed',
    ]);
    expect(outcomes(serializable, COUNTER)).toEqual({ ...before, claimed: (before.claimed ?? 0) + 2 });
  });
});
