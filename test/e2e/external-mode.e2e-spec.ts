import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { ExternalFixtureController, RETRY_LEASE_MS } from '../fixtures/external.fixture.js';
import { FixtureController, Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { startApp, type AdapterName, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { pgBouncerPerFile, routeUrl, type Route } from '../support/database-routes.js';
import { claimRow, downstreamCalls } from '../support/lease-rows.js';
import { waitUntil } from '../support/wait-until.js';
import { parkDelivery } from '../support/parked-delivery.js';

/** Caps the lease-derived Retry-After; far below the fixture's default 5-minute lease. */
const RETRY_AFTER_CAP = 5;
const EXTERNAL = 'FixtureController.external';
const CONTEXT = 'ExternalFixtureController.exposeContext';
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

const pooler = pgBouncerPerFile();

async function startFixture(route: Route, adapter: AdapterName, db: TestDatabase, inFlightStatus: 409 | 503) {
  return startApp(adapter, [
    WebhookFixtureModule.forDatabase({
      // Otherwise default options: behind the pooler the library has to cope on its own.
      databaseUrl: routeUrl(route, db, pooler),
      controllers: [FixtureController, ExternalFixtureController],
      idempotency: { retryAfterSeconds: RETRY_AFTER_CAP, inFlightStatus },
    }),
  ]);
}

/**
 * The lease answers the same on either platform (test/support/app.ts): each route runs once, the
 * two on different platforms. The pooler changes what the database sees, not what HTTP answers.
 */
const SETUPS: [Route, AdapterName][] = [
  ['direct', 'fastify'],
  ['pgbouncer', 'express'],
];

describe.each(SETUPS)('external mode (%s, %s)', (route, adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let gates: Gates;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startFixture(route, adapter, db, 409);
    gates = running.app.get(Gates);
  });

  // A failed assertion must not leave a handler parked: its app could not close.
  afterEach(() => gates?.openAll());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  /** Starts a delivery without waiting for its answer (supertest is lazy until then() is called). */
  const deliver = (url: string, path: string, body: object) =>
    request(url)
      .post(path)
      .send(body)
      .then((answer) => answer);

  it('answers an in-flight duplicate 409 with Retry-After, then replays once the first is done', async () => {
    const id = 'evt_ext_seq';
    const { answer: first } = await parkDelivery(running, '/external', { id });

    const duplicate = await request(running.url).post('/external').send({ id });
    expect(duplicate.status).toBe(409);
    // The lease has about 5 minutes left: the answer is capped by retryAfterSeconds.
    expect(duplicate.headers['retry-after']).toBe(String(RETRY_AFTER_CAP));
    expect(await downstreamCalls(db, id)).toEqual([]);
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({ status: 'in_progress', attempts: 1 });

    gates.open(id);
    const done = await first;
    expect(done.status).toBe(200);
    expect(done.body).toEqual({ processed: id, attempt: 1 });
    expect(done.headers['idempotent-replayed']).toBeUndefined();
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);
    const row = await claimRow(db, EXTERNAL, id);
    expect(row).toMatchObject({ status: 'done', attempts: 1, last_error: null });
    expect(row!.completed_at).toBeGreaterThanOrEqual(row!.claimed_at);

    const replay = await request(running.url).post('/external').send({ id });
    expect(replay.status).toBe(200);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);
  });

  it('derives Retry-After from the time left on the lease (at least 1 s, at most the lease)', async () => {
    const id = 'evt_ext_retry_after';
    const { answer: first } = await parkDelivery(running, '/external/short-lease', { id });

    const duplicate = await request(running.url).post('/external/short-lease').send({ id });
    expect(duplicate.status).toBe(409);
    const retryAfter = Number(duplicate.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(Math.min(RETRY_LEASE_MS / 1000, RETRY_AFTER_CAP));
    // The header tells the sender when the lease runs out, not earlier: after the answer the
    // database still sees at most that many seconds left.
    const { rows } = await db.pool.query(
      `SELECT CEIL(EXTRACT(EPOCH FROM (lease_expires_at - now())))::int AS left
       FROM processed_events WHERE scope = $1 AND event_key = $2`,
      ['ExternalFixtureController.shortLease', id],
    );
    expect(rows[0].left).toBeLessThanOrEqual(retryAfter);

    gates.open(id);
    expect((await first).status).toBe(200);
    expect(await downstreamCalls(db, id)).toHaveLength(1);
  });

  it('marks a throwing attempt failed and lets the very next delivery run the handler again', async () => {
    const id = 'evt_ext_fail';
    const failed = await request(running.url).post('/external/context').send({ id, fail: true });
    expect(failed.status).toBe(500);
    const failedRow = await claimRow(db, CONTEXT, id);
    expect(failedRow).toMatchObject({
      status: 'failed',
      attempts: 1,
      last_error: 'downstream failed on purpose',
    });
    expect(await downstreamCalls(db, id)).toEqual([]);

    // No waiting for the 5-minute lease: a failed claim is re-claimed at once, under a new token.
    const retried = await request(running.url).post('/external/context').send({ id });
    expect(retried.status).toBe(200);
    expect(retried.headers['idempotent-replayed']).toBeUndefined();
    expect(retried.body.attempt).toBe(2);
    expect(retried.body.leaseToken).not.toBe(failedRow?.lease_token);
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
    expect(await claimRow(db, CONTEXT, id)).toMatchObject({
      status: 'done',
      attempts: 2,
      last_error: null,
      lease_token: retried.body.leaseToken,
    });

    const replay = await request(running.url).post('/external/context').send({ id });
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(await downstreamCalls(db, id)).toHaveLength(1);
  });

  it('exposes the lease token and attempt through IdempotencyContext', async () => {
    const id = 'evt_ext_context';
    const answer = await request(running.url).post('/external/context').send({ id });
    expect(answer.status).toBe(200);
    const row = await claimRow(db, CONTEXT, id);
    expect(answer.body).toEqual({ key: id, scope: CONTEXT, leaseToken: row?.lease_token, attempt: 1 });
    expect(answer.body.leaseToken).toMatch(UUID);
  });

  it('answers 20 duplicates of a parked delivery 409 and runs the side effect once', async () => {
    const id = 'evt_ext_burst_parked';
    const answers: request.Response[] = [];
    const all = Array.from({ length: 20 }, () =>
      deliver(running.url, '/external', { id, block: true }).then((answer) => {
        answers.push(answer);
        return answer;
      }),
    );
    await gates.entered(id);
    // Everyone but the claim holder answers while it is still parked.
    await waitUntil(() => answers.length === 19, '19 answers while the holder is parked');
    expect(answers.map((answer) => answer.status)).toEqual(Array(19).fill(409));
    expect(await downstreamCalls(db, id)).toEqual([]);

    gates.open(id);
    const statuses = (await Promise.all(all)).map((answer) => answer.status);
    expect(statuses.filter((status) => status === 200)).toHaveLength(1);
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({ status: 'done', attempts: 1 });
  });

  it('runs a slow side effect exactly once under 20 concurrent deliveries', async () => {
    const id = 'evt_ext_burst_slow';
    const answers = await Promise.all(
      Array.from({ length: 20 }, () => deliver(running.url, '/external/slow', { id, slowMs: 300 })),
    );
    expect(answers.filter((answer) => answer.status >= 500)).toEqual([]);
    const fresh = answers.filter((answer) => answer.status === 200 && !answer.headers['idempotent-replayed']);
    expect(fresh).toHaveLength(1);
    // The others were in flight (409) or came after the completion (replayed).
    expect(answers.filter((answer) => answer.status !== 409 && answer.status !== 200)).toEqual([]);
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);
    expect(await claimRow(db, 'ExternalFixtureController.slow', id)).toMatchObject({
      status: 'done',
      attempts: 1,
    });
  });

  it('answers an in-flight duplicate 503 when inFlightStatus is 503', async () => {
    const strict = await startFixture(route, adapter, db, 503);
    const strictGates = strict.app.get(Gates);
    try {
      const id = 'evt_ext_503';
      const { answer: first } = await parkDelivery(strict, '/external', { id });

      const duplicate = await request(strict.url).post('/external').send({ id });
      expect(duplicate.status).toBe(503);
      expect(duplicate.headers['retry-after']).toBe(String(RETRY_AFTER_CAP));
      expect(await downstreamCalls(db, id)).toEqual([]);

      strictGates.open(id);
      expect((await first).status).toBe(200);
      expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);
    } finally {
      strictGates.openAll();
      await strict.close();
    }
  });
});
