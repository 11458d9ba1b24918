import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { PoolClient } from 'pg';
import request from 'supertest';
import { RECLAIM_SCOPE, ReclaimRaceController } from '../fixtures/reclaim-race.fixture.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, lockWaiters, type TestDatabase } from '../support/database.js';
import { waitUntil } from '../support/wait-until.js';

/**
 * How long a claim waits on a row another transaction holds: long, so the test has time to see
 * the wait and end it. It is the bound a duplicate's wait runs under, never the handler's.
 */
const DUPLICATE_WAIT_MS = 20_000;

/** Not an HTTP subject: one platform (test/support/app.ts). */
const ADAPTER = onAdapter('express');

/**
 * The rare path where the failed claim a delivery is taking back is deleted (by retention) while
 * the delivery waits on it: the delivery claims the event anew, and its handler then runs under
 * the transaction's own lock_timeout (the app's default, '0'), not the short bound a duplicate's
 * wait runs under. Before, the claim that came after the deletion put back the bound it found,
 * which was that one, and every statement of the handler could fail after `concurrentDuplicateWaitMs`.
 */
describe.each(ADAPTER)('a failed claim deleted while a delivery takes it back (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let holder: PoolClient | undefined;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers: [ReclaimRaceController],
        idempotency: { concurrentDuplicateWaitMs: DUPLICATE_WAIT_MS, reporter: false },
      }),
    ]);
  });

  afterEach(async () => {
    await holder?.query('ROLLBACK').catch(() => undefined);
    holder?.release();
    holder = undefined;
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const claims = (id: string) =>
    db.pool
      .query('SELECT status, attempts FROM processed_events WHERE scope = $1 AND event_key = $2', [
        RECLAIM_SCOPE,
        id,
      ])
      .then((result) => result.rows as { status: string; attempts: number }[]);
  /** What the sessions waiting on a lock in the test database are running. */
  const waiting = () =>
    db.pool
      .query(`SELECT query FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`, [db.name])
      .then((result) => result.rows.map((row: { query: string }) => row.query));

  /**
   * Leaves a failed claim of `id`, then delivers it again while retention's session holds the
   * failed row, and deletes the row while the delivery waits on it. Resolves with the answer.
   */
  async function deleteWhileReclaiming(app: RunningApp, id: string) {
    expect((await request(app.url).post('/reclaim/orders').send({ id, fail: true })).status).toBe(500);
    expect(await claims(id)).toEqual([{ status: 'failed', attempts: 1 }]);

    // Retention's session: it has locked the failed row and is about to delete it. A row lock, not
    // a delete yet, so the claim's INSERT ... ON CONFLICT DO NOTHING sees the row and does not
    // wait (it would wait on an uncommitted delete, then insert): the reclaim UPDATE that follows
    // it is what waits.
    holder = await db.pool.connect();
    await holder.query('BEGIN');
    await holder.query('SELECT 1 FROM processed_events WHERE scope = $1 AND event_key = $2 FOR UPDATE', [
      RECLAIM_SCOPE,
      id,
    ]);
    const answer = request(app.url)
      .post('/reclaim/orders')
      .send({ id })
      .then((response) => response);
    await waitUntil(async () => (await lockWaiters(db)) === 1, 'the delivery to wait on the held row');
    // The reclaim of the failed row waits, not the claim before it.
    const [query] = await waiting();
    expect(query).toContain('UPDATE "processed_events" AS pe SET');
    expect(query).not.toContain('INSERT');
    // The row goes while the delivery waits on it.
    await holder.query('DELETE FROM processed_events WHERE scope = $1 AND event_key = $2', [
      RECLAIM_SCOPE,
      id,
    ]);
    await holder.query('COMMIT');

    const response = await answer;
    // Claimed anew: a first attempt, done, with the handler's write.
    expect(await claims(id)).toEqual([{ status: 'done', attempts: 1 }]);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(1);
    expect(app.app.get(ReclaimRaceController).runs.get(id)).toBe(2);
    return response;
  }

  it("runs the handler under the transaction's own lock_timeout ('0'), claiming the event anew", async () => {
    const id = `evt_deleted_mid_claim_${adapter}`;
    const response = await deleteWhileReclaiming(running, id);
    expect([response.status, response.body]).toEqual([200, { processed: id, lockTimeout: '0' }]);
  });

  it('puts back a lock_timeout the connection had of its own, not just the default', async () => {
    // The app's sessions start with lock_timeout = 7s (a role or database setting would do the same).
    const url = new URL(db.url);
    url.searchParams.set('options', '-c lock_timeout=7s');
    const own = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: url.toString(),
        controllers: [ReclaimRaceController],
        idempotency: { concurrentDuplicateWaitMs: DUPLICATE_WAIT_MS, reporter: false },
      }),
    ]);
    try {
      const id = `evt_deleted_mid_claim_own_${adapter}`;
      const response = await deleteWhileReclaiming(own, id);
      expect([response.status, response.body]).toEqual([200, { processed: id, lockTimeout: '7s' }]);
    } finally {
      await own.close();
    }
  });
});
