import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { SHORT_LEASE_MS } from '../fixtures/external.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls, leaseExpired } from '../support/lease-rows.js';
import { LogCapture } from '../support/log-capture.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { waitUntil } from '../support/wait-until.js';

const EXTERNAL = 'FixtureController.external';

/**
 * Worker A claims and parks past its lease; worker B (another app on the same database) re-claims
 * and completes; then A finishes late. The fencing token keeps A from touching B's row.
 */
describe.each(onAdapter('express'))('external mode fencing (%s)', (adapter) => {
  let db: TestDatabase;
  let workerA: RunningApp;
  let workerB: RunningApp;
  let gatesA: Gates;
  let gatesB: Gates;
  const logs = new LogCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
    // A's lease runs out while it is parked; B's outlives every check made while B is parked.
    const lease = (leaseMs: number) => ({ databaseUrl: db.url, idempotency: { leaseMs } });
    workerA = await startApp(adapter, [WebhookFixtureModule.forDatabase(lease(SHORT_LEASE_MS))]);
    workerB = await startApp(adapter, [WebhookFixtureModule.forDatabase(lease(60_000))]);
    gatesA = workerA.app.get(Gates);
    gatesB = workerB.app.get(Gates);
    // Nest's logger is process-wide and each startApp resets it: install the capture last.
    workerA.app.useLogger(logs);
  });

  beforeEach(() => logs.clear());
  // A failed assertion must not leave a handler parked: its app could not close.
  afterEach(() => {
    gatesA?.openAll();
    gatesB?.openAll();
  });

  afterAll(async () => {
    await workerA?.close();
    await workerB?.close();
    await db?.drop();
  });

  /** A claims `id` and parks; resolves once B could re-claim it (A's lease ran out by the database clock). */
  async function parkPastLease(body: { id: string; fail?: boolean }) {
    const { answer: answerA } = await parkDelivery(workerA, '/external', body);
    const claimA = await claimRow(db, EXTERNAL, body.id);
    expect(claimA).toMatchObject({ status: 'in_progress', attempts: 1 });
    await waitUntil(() => leaseExpired(db, EXTERNAL, body.id), `A's lease on ${body.id} to expire`);
    return { answerA, claimA: claimA! };
  }

  /** B re-claims and completes; returns the row as B left it. */
  async function completeOnB(id: string) {
    const answerB = await request(workerB.url).post('/external').send({ id });
    expect(answerB.status).toBe(200);
    expect(answerB.headers['idempotent-replayed']).toBeUndefined();
    expect(answerB.body).toEqual({ processed: id, attempt: 2 });
    return (await claimRow(db, EXTERNAL, id))!;
  }

  const outcomes = (running: RunningApp) =>
    running.app.get(IdempotencyMetrics).snapshot().claims[EXTERNAL] ?? {};

  it('ignores a late completion from the worker that lost its lease, and reports lease_lost', async () => {
    const id = 'evt_fence_late_done';
    const lostBefore = outcomes(workerA).lease_lost ?? 0;
    const { answerA, claimA } = await parkPastLease({ id });
    const rowB = await completeOnB(id);
    expect(rowB).toMatchObject({ status: 'done', attempts: 2 });
    expect(rowB.lease_token).not.toBe(claimA.lease_token);

    gatesA.open(id);
    const lateA = await answerA;
    // The work did happen, so A still answers 200 (a 5xx would have the sender run it again).
    expect(lateA.status).toBe(200);
    expect(lateA.body).toEqual({ processed: id, attempt: 1 });

    // A's completion changed nothing: B's token, attempt and completion time stand.
    expect(await claimRow(db, EXTERNAL, id)).toEqual(rowB);
    expect(outcomes(workerA).lease_lost).toBe(lostBefore + 1);
    expect(outcomes(workerB).lease_lost).toBeUndefined();
    const errors = logs.find('error', 'Lease lost', `key ${id}`, 'attempt 1', 'current attempt 2');
    expect(errors).toHaveLength(1);
    // Fencing protects the claim row, not the outside world: A's late call still went out.
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }, { attempt: 1 }]);
  });

  it('ignores a late failure from the worker that lost its lease', async () => {
    const id = 'evt_fence_late_fail';
    const before = outcomes(workerA);
    const { answerA } = await parkPastLease({ id, fail: true });
    const rowB = await completeOnB(id);

    gatesA.open(id);
    expect((await answerA).status).toBe(500);
    // A marked nothing failed, so it counts the lost lease, not a failure.
    expect(outcomes(workerA).lease_lost).toBe((before.lease_lost ?? 0) + 1);
    expect(outcomes(workerA).failed).toBe(before.failed);
    const errors = logs.find('error', 'Lease lost', `key ${id}`, 'attempt 1', 'current attempt 2');
    expect(errors).toHaveLength(1);

    // A's "mark failed" is fenced too: the event stays done and is not re-run.
    expect(await claimRow(db, EXTERNAL, id)).toEqual(rowB);
    const replay = await request(workerB.url).post('/external').send({ id });
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
  });

  it.each([
    ['completion', false, 200],
    ['failure', true, 500],
  ])('ignores a late %s while the new holder is still working', async (_, fail, statusA) => {
    const id = `evt_fence_overlap_${fail ? 'fail' : 'done'}`;
    const lostOnB = outcomes(workerB).lease_lost ?? 0;
    const { answerA } = await parkPastLease({ id, fail });
    const { answer: answerB } = await parkDelivery(workerB, '/external', { id });
    const rowB = await claimRow(db, EXTERNAL, id);
    expect(rowB).toMatchObject({ status: 'in_progress', attempts: 2 });

    gatesA.open(id);
    expect((await answerA).status).toBe(statusA);
    // A neither marked B's event done (duplicates would be replayed before B's work happened) nor
    // failed (a third worker would re-claim it under B's feet): B's lease still holds.
    expect(await claimRow(db, EXTERNAL, id)).toEqual(rowB);
    const duplicate = await request(workerA.url).post('/external').send({ id });
    expect(duplicate.status).toBe(409);
    expect(await claimRow(db, EXTERNAL, id)).toEqual(rowB);

    gatesB.open(id);
    expect((await answerB).body).toEqual({ processed: id, attempt: 2 });
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({
      status: 'done',
      attempts: 2,
      lease_token: rowB?.lease_token,
    });
    expect(outcomes(workerB).lease_lost ?? 0).toBe(lostOnB);
  });

  it('lets a worker whose lease expired unclaimed still complete (nobody took over)', async () => {
    const id = 'evt_fence_unclaimed';
    const { answerA, claimA } = await parkPastLease({ id });
    gatesA.open(id);
    expect((await answerA).status).toBe(200);
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({
      status: 'done',
      attempts: 1,
      lease_token: claimA.lease_token,
    });
    expect(logs.find('error', 'Lease lost', `key ${id}`)).toEqual([]);
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);
  });
});
