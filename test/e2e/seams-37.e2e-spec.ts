import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { HandoffOptions } from '../../lib/index.js';
import {
  SEAMS_QUEUE,
  SEAMS_WORKER_SCOPE,
  SeamsFixtureModule,
  SeamsLedger,
  SeamsRecord,
  type SeamsEvent,
} from '../fixtures/seams-37.fixture.js';
import { TX_QUEUE } from '../fixtures/handoff.fixture.js';
import { ADAPTERS, startApp, type AdapterName, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { waitUntil } from '../support/wait-until.js';
import { pgBouncerPerFile, routeUrl, ROUTES } from '../support/database-routes.js';

/** PgBouncer in transaction mode, for the route that goes through it. */
const pooler = pgBouncerPerFile();

/** pg-boss's schema in this file. */
const SCHEMA = 'seams_37';
const HANDOFF: HandoffOptions = {
  schema: SCHEMA,
  pollingIntervalMs: 100,
  maintenanceIntervalSeconds: 1,
  queues: {
    [SEAMS_QUEUE]: { retryLimit: 2, retryDelaySeconds: 0, retryBackoff: false, expireInSeconds: 30 },
    [TX_QUEUE]: { retryLimit: 2, retryDelaySeconds: 0, retryBackoff: false, expireInSeconds: 30 },
  },
};

/**
 * Where issue 37's fixes meet each other (the answered 5xx, afterCommit() and enqueue(), the
 * ordering guard, the handler's own transactions in a worker, enqueue()'s key, replayed headers):
 * real Nest apps on real Postgres and pg-boss, effects counted in rows and calls.
 */
describe('issue 37: where its fixes meet', () => {
  let db: TestDatabase;
  const apps: RunningApp[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterEach(async () => {
    for (const running of apps.splice(0).reverse()) await running.close();
  });

  afterAll(async () => {
    await db.drop();
  });

  async function start(
    adapter: AdapterName,
    worker = false,
    serializer = false,
    databaseUrl = db.url,
    strictTransactions = false,
  ) {
    const running = await startApp(adapter, [
      SeamsFixtureModule.forSettings({
        databaseUrl,
        idempotency: { handoff: HANDOFF, strictTransactions },
        worker,
        serializer,
      }),
    ]);
    apps.push(running);
    return { running, record: running.app.get(SeamsRecord) };
  }

  const post = (url: string, path: string, event: SeamsEvent, headers: Record<string, string> = {}) =>
    fetch(`${url}/seams/${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(event),
    });
  const orders = (name: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [name]);
  const jobs = (id: string) =>
    db.count(`SELECT count(*) FROM ${SCHEMA}.job WHERE name = $1 AND data->'data'->>'id' = $2`, [
      SEAMS_QUEUE,
      id,
    ]);
  const claim = async (key: string) =>
    (await db.pool.query('SELECT status FROM processed_events WHERE event_key = $1', [key])).rows.map(
      (row: { status: string }) => row.status,
    );

  describe.each(ADAPTERS)('%s', (adapter) => {
    it('an answered 5xx drops the afterCommit() callback and the enqueued job with the write; the retry has each once', async () => {
      const { running, record } = await start(adapter);
      const id = `evt_answered_${adapter}`;
      record.statuses.set(id, 503);
      const first = await post(running.url, 'answered', { id });
      expect(first.status).toBe(503);
      expect({
        orders: await orders(`answered:${id}`),
        jobs: await jobs(id),
        callbacks: [...record.callbacks],
        claim: await claim(id),
      }).toEqual({ orders: 0, jobs: 0, callbacks: [], claim: ['failed'] });

      const retry = await post(running.url, 'answered', { id });
      expect(retry.status).toBe(200);
      expect({
        orders: await orders(`answered:${id}`),
        jobs: await jobs(id),
        callbacks: [...record.callbacks],
        runs: record.runs.filter((run) => run === `answered:${id}`).length,
        claim: await claim(id),
      }).toEqual({ orders: 1, jobs: 1, callbacks: [`answered:${id}`], runs: 2, claim: ['done'] });
    });

    it("a request-mode route's answered 5xx: no order, no job, no callback, nothing stored; the retry runs and is replayed after", async () => {
      const { running, record } = await start(adapter);
      const id = `req_answered_${adapter}`;
      const headers = { 'idempotency-key': id, 'x-user': 'alice' };
      record.statuses.set(id, 500);
      expect((await post(running.url, 'request', { id }, headers)).status).toBe(500);
      expect({
        orders: await orders(`request:${id}`),
        jobs: await jobs(id),
        callbacks: [...record.callbacks],
        claim: await claim(`alice:${id}`),
      }).toEqual({ orders: 0, jobs: 0, callbacks: [], claim: ['failed'] });

      expect((await post(running.url, 'request', { id }, headers)).status).toBe(201);
      const replay = await post(running.url, 'request', { id }, headers);
      expect(replay.status).toBe(201);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect({
        orders: await orders(`request:${id}`),
        jobs: await jobs(id),
        callbacks: [...record.callbacks],
        runs: record.runs.filter((run) => run === `request:${id}`).length,
      }).toEqual({ orders: 1, jobs: 1, callbacks: [`request:${id}`], runs: 2 });
    });

    it('external mode: an answered 5xx fires no afterCommit() callback; the retry, attempt 2, fires it once', async () => {
      const { running, record } = await start(adapter);
      const id = `evt_external_${adapter}`;
      record.statuses.set(id, 502);
      expect((await post(running.url, 'external', { id })).status).toBe(502);
      expect({ callbacks: [...record.callbacks], claim: await claim(id) }).toEqual({
        callbacks: [],
        claim: ['failed'],
      });
      const retry = await post(running.url, 'external', { id });
      expect({ status: retry.status, body: await retry.json() }).toEqual({
        status: 200,
        body: { id, attempt: 2 },
      });
      expect({ callbacks: [...record.callbacks], claim: await claim(id) }).toEqual({
        callbacks: [`external:${id}`],
        claim: ['done'],
      });
    });

    it('an ordered event answered 5xx advances no version: an older event after it applies, not stale', async () => {
      const { running, record } = await start(adapter);
      const entity = `sub_${adapter}`;
      const newer = { id: `evt_v2_${adapter}`, entity, version: 2 };
      record.statuses.set(newer.id, 500);
      expect((await post(running.url, 'ordered', newer)).status).toBe(500);
      const versions = await db.count('SELECT count(*) FROM processed_events_versions WHERE entity = $1', [
        entity,
      ]);
      expect(versions).toBe(0);

      const older = await post(running.url, 'ordered', { id: `evt_v1_${adapter}`, entity, version: 1 });
      expect(older.status).toBe(200);
      expect(older.headers.get('idempotent-stale')).toBeNull();
      // The redelivered newer event applies over it.
      const again = await post(running.url, 'ordered', newer);
      expect(again.status).toBe(200);
      expect(again.headers.get('idempotent-stale')).toBeNull();
      expect({
        v1: await orders(`ordered:evt_v1_${adapter}`),
        v2: await orders(`ordered:${newer.id}`),
        callbacks: [...record.callbacks],
      }).toEqual({ v1: 1, v2: 1, callbacks: [`ordered:evt_v1_${adapter}`, `ordered:${newer.id}`] });
    });

    it('a replay answers every Set-Cookie the first answer had, not one joined header', async () => {
      const { running, record } = await start(adapter);
      const headers = { 'idempotency-key': `cookies-${adapter}`, 'x-user': 'alice' };
      const first = await post(running.url, 'cookies', { id: `cookies-${adapter}` }, headers);
      const replay = await post(running.url, 'cookies', { id: `cookies-${adapter}` }, headers);
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
      expect(record.runs).toEqual([`cookies:cookies-${adapter}`]);
      expect(first.headers.getSetCookie()).toEqual(['a=1; Path=/', 'b=2; Path=/']);
      expect(replay.headers.getSetCookie()).toEqual(first.headers.getSetCookie());
    });
  });

  /**
   * The classifier called PREPARE a read and the EXECUTE undecided (reported, never refused), so
   * strictTransactions let an outside INSERT through when it was prepared first: a prepared write
   * is the write now, refused before anything runs.
   */
  it('strictTransactions refuses an outside INSERT that is prepared, then executed: nothing written', async () => {
    const { running, record } = await start('express', false, false, db.url, true);
    const id = 'evt_prepared';
    const answer = await post(running.url, 'prepared', { id });
    expect(record.runs).toEqual([`prepared:${id}`]);
    expect({
      status: answer.status,
      outside: await orders(`prepared:${id}`),
      claim: await claim(id),
    }).toEqual({
      status: 500,
      outside: 0,
      claim: ['failed'],
    });
    const { rows } = await db.pool.query('SELECT last_error FROM processed_events WHERE event_key = $1', [
      id,
    ]);
    expect(rows[0].last_error).toContain('Refused (strictTransactions)');
  });

  it("an @Idempotent method called outside any delivery: its own transaction's rollback takes its write, callback and job; the rest commit once", async () => {
    const { running, record } = await start('express');
    const ledger = running.app.get(SeamsLedger);
    const id = 'ledger_1';
    expect(await ledger.settle({ id })).toEqual({ settled: id });
    expect(await ledger.settle({ id })).toBe('replayed');
    expect({
      runs: record.runs,
      callbacks: record.callbacks,
      inner: await orders(`ledger-inner:${id}`),
      outer: await orders(`ledger:${id}`),
      innerJobs: await jobs(`${id}:inner`),
      jobs: await jobs(id),
      claim: await claim(id),
    }).toEqual({
      runs: [`ledger:${id}`],
      callbacks: [`ledger:${id}`],
      inner: 0,
      outer: 1,
      innerJobs: 0,
      jobs: 1,
      claim: ['done'],
    });
  });

  describe.each(ROUTES)('all of them in one delivery (%s)', (route) => {
    it("a handler transaction that rolls back, caught, then an answered 5xx, then the retry; its job's worker does the same", async () => {
      const { running, record } = await start('express', true, false, routeUrl(route, db, pooler));
      const id = `evt_all_${route}`;
      record.statuses.set(id, 500);
      expect((await post(running.url, 'answered', { id, innerFails: true })).status).toBe(500);
      expect({
        orders: await orders(`answered:${id}`),
        inner: await orders(`answered-inner:${id}`),
        jobs: (await jobs(id)) + (await jobs(`${id}:inner`)),
        // The worker runs the jobs earlier tests left on the queue too: this delivery's only.
        callbacks: record.callbacks.filter((name) => name.endsWith(`:${id}`)),
      }).toEqual({ orders: 0, inner: 0, jobs: 0, callbacks: [] });

      expect((await post(running.url, 'answered', { id, innerFails: true })).status).toBe(200);
      const completed = () =>
        db.count(
          `SELECT count(*) FROM ${SCHEMA}.job WHERE name = $1 AND state = 'completed' AND data->'data'->>'id' = $2`,
          [SEAMS_QUEUE, id],
        );
      await waitUntil(async () => (await completed()) === 1, 'the job to complete');
      const calls = (name: string) =>
        db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [name]);
      expect({
        orders: await orders(`answered:${id}`),
        inner: await orders(`answered-inner:${id}`),
        jobs: await jobs(id),
        innerJobs: await jobs(`${id}:inner`),
        workerInner: await calls(`inner:${id}`),
        workerOuter: await calls(`outer:${id}`),
        callbacks: record.callbacks.filter((name) => name.endsWith(`:${id}`)),
      }).toEqual({
        orders: 1,
        inner: 0,
        jobs: 1,
        innerJobs: 0,
        workerInner: 0,
        workerOuter: 1,
        callbacks: [`answered:${id}`, `worker:${id}`],
      });
      // The worker claimed the job by its own key, its id, and recorded it done once.
      const { rows } = await db.pool.query(
        `SELECT c.status FROM processed_events c JOIN ${SCHEMA}.job j ON c.event_key = j.id::text
         WHERE c.scope = $1 AND j.data->'data'->>'id' = $2`,
        [SEAMS_WORKER_SCOPE, id],
      );
      expect(rows).toEqual([{ status: 'done' }]);
    });
  });
});
