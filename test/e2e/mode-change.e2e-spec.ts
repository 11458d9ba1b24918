import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { DataSource } from 'typeorm';
import type { ClaimOutcome } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { expireLease } from '../../lib/testing/index.js';
import {
  captureRelease,
  HandlerCalls,
  ModeChangeFixtureModule,
  ModeSharingController,
  RELEASE_SCOPE,
  SHARED_SCOPE,
  MODE_LEASE_MS,
} from '../fixtures/mode-change.fixture.js';
import { Gates } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type AdapterName, type RunningApp } from '../support/app.js';
import { createTestDatabase, lockWaiters, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls } from '../support/lease-rows.js';
import { LogCapture } from '../support/log-capture.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { waitUntil, within } from '../support/wait-until.js';

/** Far above the lease's 20 s, so a Retry-After at or under 20 can only come from the lease. */
const RETRY_AFTER_SECONDS = 60;
/** Short, so a duplicate that waits on an open claim is answered quickly. */
const DUPLICATE_WAIT_MS = 500;

/**
 * Where each mode's handler of one scope is served: by one app (two handlers sharing a scope), or
 * by two apps on one database (a rolling deploy that changed the handler's mode while a delivery
 * of the old release was still running).
 */
interface Layout {
  scope: string;
  external: { running: RunningApp; path: string };
  transaction: { running: RunningApp; path: string };
  apps: RunningApp[];
}

const LAYOUTS = ['two handlers sharing a scope', 'a deploy that changes the mode'] as const;
type LayoutName = (typeof LAYOUTS)[number];

async function startLayout(name: LayoutName, adapter: AdapterName, db: TestDatabase): Promise<Layout> {
  const idempotency = {
    retryAfterSeconds: RETRY_AFTER_SECONDS,
    concurrentDuplicateWaitMs: DUPLICATE_WAIT_MS,
  };
  const start = (controllers: ReturnType<typeof captureRelease>[]) =>
    startApp(adapter, [
      ModeChangeFixtureModule.forSettings({ databaseUrl: db.url, controllers, idempotency }),
    ]);
  if (name === 'two handlers sharing a scope') {
    const running = await start([ModeSharingController]);
    return {
      scope: SHARED_SCOPE,
      external: { running, path: '/modes/external' },
      transaction: { running, path: '/modes/transaction' },
      apps: [running],
    };
  }
  const before = await start([captureRelease('external')]);
  const after = await start([captureRelease('transaction')]);
  return {
    scope: RELEASE_SCOPE,
    external: { running: before, path: '/capture' },
    transaction: { running: after, path: '/capture' },
    apps: [before, after],
  };
}

/**
 * One scope claimed in both modes (finding 1 of issue 16): a transaction-mode claim that met an
 * external-mode `in_progress` row answered 200 replayed and never ran, so a live lease's unfinished
 * work was acknowledged, and an expired one (its worker dead) was acknowledged forever. Now a live
 * lease is in flight, an expired one is taken back in the claim's transaction (its token cleared,
 * so the old holder's fenced completion matches nothing), and the handler runs.
 */
describe.each(onAdapter('express').flatMap((adapter) => LAYOUTS.map((layout) => [adapter, layout] as const)))(
  'one scope in both modes (%s, %s)',
  (adapter, layoutName) => {
    let db: TestDatabase;
    let layout: Layout;
    const logs = new LogCapture();

    beforeAll(async () => {
      db = await createTestDatabase();
      layout = await startLayout(layoutName, adapter, db);
      layout.apps[0].app.useLogger(logs);
    });

    // A failed assertion must not leave a handler parked: its app could not close.
    afterEach(() => {
      for (const running of layout?.apps ?? []) running.app.get(Gates).openAll();
      logs.clear();
    });

    afterAll(async () => {
      for (const running of layout?.apps ?? []) await running.close();
      await db?.drop();
    });

    const post = (side: 'external' | 'transaction', body: object) =>
      request(layout[side].running.url).post(layout[side].path).send(body);
    const park = (side: 'external' | 'transaction', id: string) =>
      parkDelivery(layout[side].running, layout[side].path, { id });
    const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
    /** Which handlers ran for `id`, in every app of the layout, in the order they started. */
    const handlersRun = (id: string) =>
      HandlerCalls.of(
        layout.apps.map((running) => running.app.get(HandlerCalls)),
        id,
      );
    /** How many outcomes of `outcome` the app serving `side` has counted for the scope so far. */
    const counted = (side: 'external' | 'transaction', outcome: ClaimOutcome) =>
      layout[side].running.app.get(IdempotencyMetrics).snapshot().claims[layout.scope]?.[outcome] ?? 0;
    const secondsLeft = async (id: string) => {
      const { rows } = await db.pool.query<{ left: number }>(
        `SELECT CEIL(EXTRACT(EPOCH FROM (lease_expires_at - now())))::int AS left
         FROM processed_events WHERE scope = $1 AND event_key = $2`,
        [layout.scope, id],
      );
      return rows[0].left;
    };

    it('answers a transaction-mode delivery 409 while an external-mode lease is live, without running it', async () => {
      const id = `evt_live_${adapter}_${layoutName.length}`;
      const inFlightBefore = counted('transaction', 'in_flight');
      const holder = await park('external', id);
      const claimed = await claimRow(db, layout.scope, id);
      expect(claimed).toMatchObject({ status: 'in_progress', attempts: 1 });

      const duplicate = await post('transaction', { id });
      expect(duplicate.status).toBe(409);
      // Held by a lease with about 20 s left: Retry-After follows the lease, far under the 60 s cap,
      // and no earlier than the lease can run out.
      const retryAfter = Number(duplicate.headers['retry-after']);
      expect(retryAfter).toBeGreaterThanOrEqual(1);
      expect(retryAfter).toBeLessThanOrEqual(MODE_LEASE_MS / 1000);
      expect(await secondsLeft(id)).toBeLessThanOrEqual(retryAfter);
      expect(handlersRun(id)).toEqual(['external']);
      expect(await orders(id)).toBe(0);
      // The lease is untouched: its holder still owns it.
      expect(await claimRow(db, layout.scope, id)).toEqual(claimed);

      holder.gates.open(id);
      const done = await holder.answer;
      expect(done.status).toBe(200);
      expect(done.body).toEqual({ called: id, attempt: 1 });
      expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);
      expect(await claimRow(db, layout.scope, id)).toMatchObject({ status: 'done', attempts: 1 });

      // Now done: the transaction-mode handler replays it, still without running.
      const replay = await post('transaction', { id });
      expect(replay.status).toBe(200);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(handlersRun(id)).toEqual(['external']);
      expect(await orders(id)).toBe(0);
      expect(counted('transaction', 'in_flight')).toBe(inFlightBefore + 1);
    });

    it('takes an expired external-mode lease back in the transaction; the old holder finds its lease lost', async () => {
      const id = `evt_expired_${adapter}_${layoutName.length}`;
      const reclaimedBefore = counted('transaction', 'reclaimed');
      const lostBefore = counted('external', 'lease_lost');
      const holder = await park('external', id);
      const dataSource = layout.external.running.app.get(DataSource);
      // Its worker is as good as dead: the lease has run out by the database clock.
      expect(await expireLease(dataSource, layout.scope, id)).toBe(true);

      const taken = await post('transaction', { id });
      expect(taken.status).toBe(200);
      expect(taken.body).toEqual({ ordered: id });
      expect(taken.headers['idempotent-replayed']).toBeUndefined();
      expect(handlersRun(id)).toEqual(['external', 'transaction']);
      expect(await orders(id)).toBe(1);
      expect(await claimRow(db, layout.scope, id)).toMatchObject({
        status: 'done',
        attempts: 2,
        lease_token: null,
        lease_expires_at: null,
        last_error: null,
      });
      expect(counted('transaction', 'reclaimed')).toBe(reclaimedBefore + 1);

      // The old holder wakes up: its renewal and its fenced completion match nothing, so it makes
      // no call and leaves the row as the transaction-mode claim wrote it.
      holder.gates.open(id);
      const late = await holder.answer;
      expect(late.status).toBe(200);
      expect(late.body).toEqual({ stopped: id, attempt: 1 });
      expect(await downstreamCalls(db, id)).toEqual([]);
      expect(await claimRow(db, layout.scope, id)).toMatchObject({
        status: 'done',
        attempts: 2,
        lease_token: null,
      });
      expect(counted('external', 'lease_lost')).toBe(lostBefore + 1);
      expect(logs.find('error', `Lease lost: ${layout.scope} key ${id} finished attempt 1`)).toHaveLength(1);

      // Both modes now replay it; the effect stays one order.
      for (const side of ['transaction', 'external'] as const) {
        const replay = await post(side, { id });
        expect(replay.status).toBe(200);
        expect(replay.headers['idempotent-replayed']).toBe('true');
      }
      expect(handlersRun(id)).toEqual(['external', 'transaction']);
      expect(await orders(id)).toBe(1);
      expect(await downstreamCalls(db, id)).toEqual([]);
    });

    it('replays an external-mode delivery of an event the transaction-mode handler did', async () => {
      const id = `evt_tx_done_${adapter}_${layoutName.length}`;
      expect((await post('transaction', { id })).status).toBe(200);
      const done = await claimRow(db, layout.scope, id);
      expect(done).toMatchObject({ status: 'done', attempts: 1, lease_token: null });

      const replay = await post('external', { id });
      expect(replay.status).toBe(200);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(handlersRun(id)).toEqual(['transaction']);
      expect(await downstreamCalls(db, id)).toEqual([]);
      expect(await claimRow(db, layout.scope, id)).toEqual(done);
    });

    it('lets an external-mode delivery take back a transaction-mode failure as attempt 2', async () => {
      const id = `evt_tx_failed_${adapter}_${layoutName.length}`;
      expect((await post('transaction', { id, fail: true })).status).toBe(500);
      expect(await claimRow(db, layout.scope, id)).toMatchObject({ status: 'failed', attempts: 1 });
      expect(await orders(id)).toBe(0);

      const retried = await post('external', { id });
      expect(retried.status).toBe(200);
      expect(retried.body).toEqual({ called: id, attempt: 2 });
      expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
      expect(await claimRow(db, layout.scope, id)).toMatchObject({ status: 'done', attempts: 2 });
      expect(handlersRun(id)).toEqual(['transaction', 'external']);
    });

    it('answers an external-mode delivery that meets an open transaction-mode claim within the duplicate wait, then replays it', async () => {
      const id = `evt_tx_open_${adapter}_${layoutName.length}`;
      const holder = await park('transaction', id);

      // The transaction-mode claim is uncommitted: the external-mode claim must not wait on its
      // row lock for as long as that transaction stays open.
      const started = Date.now();
      const duplicate = await within(
        post('external', { id }).then((answer) => answer),
        DUPLICATE_WAIT_MS + 2_000,
        'the external-mode duplicate of an open transaction-mode claim to be answered',
      ).catch(async (error: unknown) => {
        // Let the held claim go, so the stuck duplicate and the app can finish.
        holder.gates.open(id);
        await holder.answer;
        throw error;
      });
      expect(Date.now() - started).toBeLessThan(DUPLICATE_WAIT_MS + 2_000);
      expect(duplicate.status).toBe(409);
      expect(Number(duplicate.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      expect(handlersRun(id)).toEqual(['transaction']);
      expect(await lockWaiters(db)).toBe(0);

      holder.gates.open(id);
      expect((await holder.answer).status).toBe(200);
      const replay = await post('external', { id });
      expect(replay.status).toBe(200);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(handlersRun(id)).toEqual(['transaction']);
      expect(await orders(id)).toBe(1);
      expect(await downstreamCalls(db, id)).toEqual([]);
      await waitUntil(async () => (await lockWaiters(db)) === 0, 'no session waiting on a lock');
    });
  },
);
