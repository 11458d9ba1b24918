import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { CLAIM_SQL } from '../support/claim-sql.js';
import { InProcessWaitController, keyArrivals } from '../fixtures/in-process-wait.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, lockWaiters, openTransactions, type TestDatabase } from '../support/database.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy.js';

const SCOPE = 'InProcessWaitController.order';
/** More duplicates than the pool has connections: waiting in Postgres, they could not all wait. */
const POOL_SIZE = 5;
const DUPLICATES = 3 * POOL_SIZE;
/** A bound no test reaches: the first delivery's commit or rollback ends every wait. */
const LONG_WAIT_MS = 30_000;

/**
 * Duplicates of a delivery this process is running wait for it in memory, holding no connection
 * and sending nothing to Postgres, and learn how it ended: a commit answers every one of them
 * replayed; a rollback lets exactly one claim and run in its place, and the rest are answered
 * after that one. The app talks to Postgres through a TcpProxy, which counts the claim
 * statements it really sent.
 */
describe.each(onAdapter('express'))('duplicates waiting in memory (%s)', (adapter) => {
  let db: TestDatabase;
  let proxy: TcpProxy;
  let running: RunningApp;
  let gates: Gates;

  beforeAll(async () => {
    db = await createTestDatabase();
    const target = new URL(db.url);
    proxy = await startTcpProxy(target.hostname, Number(target.port));
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: proxy.url(db.url),
        poolSize: POOL_SIZE,
        controllers: [InProcessWaitController],
        // The reporter's ticks would be statements of no delivery.
        idempotency: { concurrentDuplicateWaitMs: LONG_WAIT_MS, reporter: false },
      }),
    ]);
    gates = running.app.get(Gates);
  });

  // A failed assertion must not leave a handler parked: its app could not close.
  afterEach(() => gates?.openAll());

  afterAll(async () => {
    await running?.close();
    await proxy?.close();
    await db?.drop();
  });

  /**
   * Claim statements the app sent for `id`: each is one simple query `BEGIN; EXECUTE
   * idempotency_transaction_claim('scope', 'id', ...)` (with a PREPARE in front the first time on a
   * connection), the key among its literals.
   */
  const claimsSent = (id: string) =>
    proxy.statements.filter(
      (statement) =>
        statement.kind === 'query' &&
        statement.text.includes(`EXECUTE ${CLAIM_SQL.transactionClaim.name}`) &&
        statement.text.includes(`'${id}'`),
    ).length;
  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const claims = (id: string) =>
    db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [id]);
  const outcomes = () => running.app.get(IdempotencyMetrics).snapshot().claims[SCOPE] ?? {};
  /** Starts a delivery without awaiting it (supertest only sends once `then` is called). */
  const deliver = (id: string) =>
    request(running.url)
      .post('/waits/orders')
      .send({ id })
      .then((answer) => answer);

  /** Parks the first delivery of `id`, sends the duplicates, and resolves once all of them wait. */
  async function parkWithDuplicates(id: string, fail: boolean) {
    const first = await parkDelivery(running, '/waits/orders', { id, fail });
    expect(claimsSent(id)).toBe(1);
    const duplicates = Array.from({ length: DUPLICATES }, () => deliver(id));
    await keyArrivals.waitFor(id, 1 + DUPLICATES);

    // In memory: none of them waits on the claim's row lock or holds a transaction, and none
    // sent a claim of its own.
    expect(await lockWaiters(db)).toBe(0);
    expect(await openTransactions(db)).toBe(1);
    expect(claimsSent(id)).toBe(1);
    return { first: first.answer, duplicates };
  }

  it('answers every duplicate 200 replayed, never 409, once the first commits, with no claim of their own', async () => {
    const id = `evt_wait_commits_${adapter}`;
    const before = outcomes();
    const { first, duplicates } = await parkWithDuplicates(id, false);

    gates.open(id);
    const firstAnswer = await first;
    expect(firstAnswer.status).toBe(200);
    expect(firstAnswer.body).toEqual({ processed: id });
    expect(firstAnswer.headers['idempotent-replayed']).toBeUndefined();
    const answers = await Promise.all(duplicates);
    expect(answers.map((answer) => [answer.status, answer.headers['idempotent-replayed']])).toEqual(
      Array(DUPLICATES).fill([200, 'true']),
    );

    expect(claimsSent(id)).toBe(1);
    expect(await orders(id)).toBe(1);
    expect(await claims(id)).toBe(1);
    expect(running.app.get(InProcessWaitController).runs.get(id)).toBe(1);
    expect(outcomes()).toEqual({
      ...before,
      claimed: (before.claimed ?? 0) + 1,
      replayed: (before.replayed ?? 0) + DUPLICATES,
    });
  });

  it('lets exactly one waiter claim and run when the first fails; the rest are answered after it, replayed', async () => {
    const id = `evt_wait_fails_${adapter}`;
    const before = outcomes();
    const { first, duplicates } = await parkWithDuplicates(id, true);

    gates.open(id);
    const firstAnswer = await first;
    expect(firstAnswer.status).toBe(500);
    const answers = await Promise.all(duplicates);
    expect(answers.every((answer) => answer.status === 200)).toBe(true);
    const processed = answers.filter((answer) => answer.headers['idempotent-replayed'] === undefined);
    expect(processed).toHaveLength(1);
    expect(processed[0].body).toEqual({ processed: id });
    expect(answers.filter((answer) => answer.headers['idempotent-replayed'] === 'true')).toHaveLength(
      DUPLICATES - 1,
    );

    // The first's claim and the one waiter's: the others never went to Postgres.
    expect(claimsSent(id)).toBe(2);
    expect(await orders(id)).toBe(1);
    expect(await claims(id)).toBe(1);
    expect(running.app.get(InProcessWaitController).runs.get(id)).toBe(2);
    // One outcome per delivery: the first failed, the waiter took back the claim it left failed
    // (reclaimed, not claimed), the rest were replayed.
    expect(outcomes()).toEqual({
      ...before,
      reclaimed: (before.reclaimed ?? 0) + 1,
      failed: (before.failed ?? 0) + 1,
      replayed: (before.replayed ?? 0) + DUPLICATES - 1,
    });
  });
});
