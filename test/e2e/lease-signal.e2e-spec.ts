import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { IdempotencyService } from '../../lib/index.js';
import { expireLease } from '../../lib/testing/index.js';
import {
  ABORT_WAIT_MS,
  FETCH_LEASE_MS,
  LeaseSignalController,
  type SignalSeen,
} from '../fixtures/lease-signal.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { waitUntil, within } from '../support/wait-until.js';

/** How long the slow downstream holds a request before it answers: far beyond FETCH_LEASE_MS. */
const DOWNSTREAM_HOLD_MS = 8_000;
/** What the signal's reason says when a renewal found the lease taken over, and when it ran out. */
const TAKEN_OVER = 'was taken over by another worker';
const RAN_OUT = 'ran out before the handler finished';
/** The start of the error `manager` throws in external mode (core/claim-delivery.ts). */
const NO_CLAIM_TRANSACTION = 'runs in external mode, which holds no claim transaction';

const scope = (method: string) => `LeaseSignalController.${method}`;

/** A signal as a handler sees it when untouched. */
const LIVE: SignalSeen = { isAbortSignal: true, aborted: false, reason: null };

/**
 * A downstream on loopback that holds each request for DOWNSTREAM_HOLD_MS before answering, and
 * records whether each was answered or abandoned by its caller first.
 */
async function startSlowDownstream() {
  const ends: ('answered' | 'abandoned')[] = [];
  let received = 0;
  const server: Server = createServer((req, res) => {
    received++;
    req.resume();
    const timer = setTimeout(() => res.end('late'), DOWNSTREAM_HOLD_MS);
    res.on('close', () => {
      clearTimeout(timer);
      ends.push(res.writableFinished ? 'answered' : 'abandoned');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/capture`,
    ends,
    received: () => received,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Not an HTTP subject: one platform (test/support/app.ts). */
const ADAPTER = onAdapter('express');

/**
 * `IdempotencyContext.signal` aborts when the delivery no longer holds its claim: in external mode
 * when a renewal (extendLease() or the heartbeat) finds the lease taken over, and when the lease
 * runs out while the handler still runs, with a reason named LeaseLostError; a handler that hands
 * it to fetch() abandons its call. It never aborts in transaction mode, nor after a handler has
 * finished. And external mode has no manager: reading it throws, saying why.
 */
describe.each(ADAPTER)('the delivery signal and the missing manager of external mode (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let controller: LeaseSignalController;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers: [LeaseSignalController],
        idempotency: { reporter: false },
      }),
    ]);
    controller = running.app.get(LeaseSignalController);
  });

  // A failed assertion must not leave a handler parked: its app could not close.
  afterEach(() => running?.app.get(Gates).openAll());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const post = (path: string, body: object) =>
    request(running.url)
      .post(path)
      .send(body)
      .then((answer) => answer);
  const claim = (method: string, id: string) =>
    db.pool
      .query(
        'SELECT status, attempts, lease_token, last_error FROM processed_events WHERE scope = $1 AND event_key = $2',
        [scope(method), id],
      )
      .then(
        (result) =>
          result.rows[0] as
            { status: string; attempts: number; lease_token: string; last_error: string | null } | undefined,
      );
  /** Another worker's claim of a live lease, as a re-claim after its expiry writes it: a new token. */
  const takeOver = (method: string, id: string) =>
    db.pool
      .query(
        `UPDATE processed_events SET lease_token = gen_random_uuid(), attempts = attempts + 1,
           claimed_at = now(), lease_expires_at = now() + interval '1 minute'
         WHERE scope = $1 AND event_key = $2 AND status = 'in_progress' RETURNING lease_token`,
        [scope(method), id],
      )
      .then((result) => result.rows[0]?.lease_token as string | undefined);

  it('throws from manager in external mode, saying there is no claim transaction', async () => {
    const id = `evt_manager_${adapter}`;
    const answer = await post('/signal/manager', { id });
    expect(answer.status).toBe(200);
    expect(answer.body.threw).toEqual(expect.stringContaining(`${scope('manager')} ${NO_CLAIM_TRANSACTION}`));
    expect(await claim('manager', id)).toMatchObject({ status: 'done', attempts: 1 });
  });

  it('throws from delivery.manager of an external-mode IdempotencyService.run(), and hands it a live signal', async () => {
    const service = running.app.get(IdempotencyService);
    const key = `evt_run_manager_${adapter}`;
    const result = await service.run({ scope: 'signal.run', key, mode: 'external' }, (delivery) => {
      let threw: string | null = null;
      try {
        void delivery.manager;
      } catch (error) {
        threw = (error as Error).message;
      }
      return {
        threw,
        signal: { isAbortSignal: delivery.signal instanceof AbortSignal, aborted: delivery.signal?.aborted },
      };
    });
    expect(result).toEqual({
      status: 'processed',
      value: {
        threw: expect.stringContaining(`signal.run ${NO_CLAIM_TRANSACTION}`),
        signal: { isAbortSignal: true, aborted: false },
      },
    });
  });

  it('aborts the signal when extendLease() finds the lease taken over by another delivery', async () => {
    const id = `evt_extend_${adapter}`;
    const parked = await parkDelivery(running, '/signal/extend', { id });
    // The holder's lease runs out (as if it had stalled) and a redelivery claims the event: attempt 2.
    expect(await expireLease(running.app.get(DataSource), scope('extend'), id)).toBe(true);
    const second = await post('/signal/extend', { id });
    expect(second.status).toBe(200);
    expect(second.body).toEqual({ held: true, attempt: 2, signal: LIVE });

    parked.gates.open(id);
    const first = await parked.answer;
    expect(first.status).toBe(200);
    expect(first.body).toEqual({
      held: false,
      attempt: 1,
      signal: {
        isAbortSignal: true,
        aborted: true,
        reason: { name: 'LeaseLostError', message: expect.stringContaining(TAKEN_OVER) },
      },
    });
    // The second delivery's completion stands.
    expect(await claim('extend', id)).toMatchObject({ status: 'done', attempts: 2 });
  });

  it('aborts the signal when the heartbeat finds the lease taken over', async () => {
    const id = `evt_heartbeat_${adapter}`;
    const answer = post('/signal/heartbeat', { id });
    await controller.recorder.started(id);
    const token = await takeOver('heartbeat', id);
    expect(token).toBeDefined();

    // The heartbeat renews every third of the 1.5 s lease: the next renewal finds the new token.
    const { status, body } = await within(answer, ABORT_WAIT_MS + 5_000, 'the heartbeat delivery to answer');
    expect(status).toBe(200);
    expect(body).toEqual({
      aborted: true,
      signal: {
        isAbortSignal: true,
        aborted: true,
        reason: { name: 'LeaseLostError', message: expect.stringContaining(TAKEN_OVER) },
      },
    });
    // The fenced completion left the new holder's lease alone.
    expect(await claim('heartbeat', id)).toMatchObject({
      status: 'in_progress',
      attempts: 2,
      lease_token: token,
    });
  });

  it('abandons a real fetch() given the signal when the lease runs out while it waits', async () => {
    const downstream = await startSlowDownstream();
    try {
      const id = `evt_fetch_${adapter}`;
      const started = performance.now();
      const answer = await post('/signal/fetch', { id, url: downstream.url });
      const elapsed = performance.now() - started;

      // The handler's call was aborted by the lease timer, and the handler failed with its reason.
      expect(answer.status).toBe(500);
      expect(controller.recorder.caught.get(id)).toEqual({
        name: 'LeaseLostError',
        message: expect.stringContaining(RAN_OUT),
      });
      expect(elapsed).toBeGreaterThanOrEqual(FETCH_LEASE_MS - 50);
      expect(elapsed).toBeLessThan(DOWNSTREAM_HOLD_MS);
      // The downstream got the call, and its caller hung up before any answer.
      await waitUntil(() => downstream.ends.length === 1, 'the downstream to see its request end');
      expect([downstream.received(), downstream.ends]).toEqual([1, ['abandoned']]);
      // Nobody had taken the event: the failure is this attempt's, and the next delivery claims it.
      expect(await claim('fetchSlowly', id)).toMatchObject({
        status: 'failed',
        attempts: 1,
        last_error: expect.stringContaining(RAN_OUT),
      });
    } finally {
      await downstream.close();
    }
  });

  it('answers aborted to a handler that first looks at its signal after its lease ran out', async () => {
    const id = `evt_late_${adapter}`;
    // The handler's work outlives its 1 s lease; only then does it read the signal.
    const answer = await post('/signal/late', { id, workMs: FETCH_LEASE_MS + 300 });
    expect(answer.status).toBe(200);
    expect(answer.body).toEqual({
      isAbortSignal: true,
      aborted: true,
      reason: { name: 'LeaseLostError', message: expect.stringContaining(RAN_OUT) },
    });
  });

  it('never aborts the signal of a handler that finished in time, after its lease would have run out', async () => {
    const id = `evt_finished_${adapter}`;
    const answer = await post('/signal/finished', { id });
    expect([answer.status, answer.body]).toEqual([200, LIVE]);
    const signal = controller.recorder.signals.get(id)!;
    // Past the end of the 1 s lease the handler held: nothing follows a finished delivery.
    const aborted = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), FETCH_LEASE_MS + 500);
      signal.addEventListener('abort', () => {
        clearTimeout(timer);
        resolve(true);
      });
    });
    expect(aborted).toBe(false);
    expect(await claim('finished', id)).toMatchObject({ status: 'done', attempts: 1 });
  });

  it('hands transaction-mode handlers a signal of their own that never aborts', async () => {
    const ids = [`evt_tx_signal_a_${adapter}`, `evt_tx_signal_b_${adapter}`];
    const parked = await parkDelivery(running, '/signal/transaction', { id: ids[0] });
    // Held past the 1 s a short lease would have had.
    const other = await post('/signal/transaction', { id: ids[1] });
    await new Promise((resolve) => setTimeout(resolve, FETCH_LEASE_MS + 200));
    parked.gates.open(ids[0]);
    const first = await parked.answer;
    expect([first.status, first.body]).toEqual([200, LIVE]);
    expect([other.status, other.body]).toEqual([200, LIVE]);
    const [a, b] = ids.map((id) => controller.recorder.signals.get(id)!);
    expect(a).not.toBe(b);
    expect([a.aborted, b.aborted]).toEqual([false, false]);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = ANY($1)', [ids])).toBe(2);
  });
});
