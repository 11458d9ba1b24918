import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { AnsweredStatusFixtureController } from '../fixtures/answered-status.fixture.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/**
 * A handler that sets a status and returns normally, instead of throwing: a 5xx is a failure in
 * every mode (the claim and its writes roll back, or the attempt is marked failed; nothing is
 * stored; the retry runs again), answered with the handler's own status and body. A 4xx answered
 * that way is an answer: it is stored and replayed (a 4xx that leaves no claim is one thrown).
 * An HTTP answer, so on both platforms.
 */
describe.each(ADAPTERS)('a status the handler answers (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let fixture: AnsweredStatusFixtureController;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers: [AnsweredStatusFixtureController],
      }),
    ]);
    fixture = running.app.get(AnsweredStatusFixtureController);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const post = (path: string, body: object, key?: string) => {
    const sent = request(running.url).post(`/answered/${path}`).set('X-User', 'user_a');
    return (key === undefined ? sent : sent.set('Idempotency-Key', `"${key}"`)).send(body);
  };
  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const downstreamCalls = async (id: string) =>
    (
      await db.pool.query('SELECT attempt FROM downstream_calls WHERE event_id = $1 ORDER BY id', [id])
    ).rows.map((row: { attempt: number }) => row.attempt);
  const claim = async (eventKey: string) =>
    (
      await db.pool.query(
        `SELECT status, attempts, response, last_error
         FROM processed_events WHERE event_key = $1`,
        [eventKey],
      )
    ).rows;
  const runsOf = (id: string) => fixture.runs.filter((ran) => ran === id).length;

  describe.each([500, 503])('a %i set with @Res({ passthrough: true })', (status) => {
    it('@IdempotentRequest: rolls the write back, stores nothing, and the retry runs and stores its own answer', async () => {
      const id = `ord_req_${status}_${adapter}`;
      const key = `key-req-${status}-${adapter}`;
      fixture.statuses.set(id, status);

      const first = await post('request', { id, amount: 5 }, key);
      // The client gets the handler's own answer: its status, its body, no replay marker.
      expect(first.status).toBe(status);
      expect(first.body).toEqual({ order: expect.any(Number), id, failed: status });
      expect(first.headers['idempotent-replayed']).toBeUndefined();
      // Rolled back: no order, and the claim is not done and holds no response.
      expect(await orders(id)).toBe(0);
      expect(await claim(`user_a:${key}`)).toEqual([
        expect.objectContaining({
          status: 'failed',
          response: null,
          last_error: expect.stringContaining(`${status}`),
        }),
      ]);

      // The retry runs the handler again, which succeeds now: its effect is there once, stored.
      const retry = await post('request', { id, amount: 5 }, key);
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBeUndefined();
      expect(retry.body).toEqual({ order: expect.any(Number), id });
      expect(await orders(id)).toBe(1);
      expect(await claim(`user_a:${key}`)).toEqual([
        expect.objectContaining({
          status: 'done',
          attempts: 2,
          response: expect.objectContaining({ status: 201 }),
        }),
      ]);
      // And the one after replays that success, not the 5xx.
      const replay = await post('request', { id, amount: 5 }, key);
      expect(replay.status).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body).toEqual(retry.body);
      expect(runsOf(id)).toBe(2);
      expect(await orders(id)).toBe(1);
    });

    it('@IdempotentRequest external mode: marks the attempt failed, stores nothing, and the retry runs at once', async () => {
      const id = `ord_req_ext_${status}_${adapter}`;
      const key = `key-req-ext-${status}-${adapter}`;
      fixture.statuses.set(id, status);

      const first = await post('request-external', { id }, key);
      expect(first.status).toBe(status);
      expect(first.body).toEqual({ id, attempt: 1, failed: status });
      expect(await claim(`user_a:${key}`)).toEqual([
        expect.objectContaining({ status: 'failed', response: null }),
      ]);

      // Claimable at once (not after its lease, 5 minutes): the retry is attempt 2, and is stored.
      const retry = await post('request-external', { id }, key);
      expect(retry.status).toBe(201);
      expect(retry.body).toEqual({ id, attempt: 2 });
      expect(await claim(`user_a:${key}`)).toEqual([
        expect.objectContaining({
          status: 'done',
          attempts: 2,
          response: expect.objectContaining({ status: 201 }),
        }),
      ]);
      const replay = await post('request-external', { id }, key);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body).toEqual(retry.body);
      // Work outside the database happened on each attempt the handler ran: once per attempt.
      expect(await downstreamCalls(id)).toEqual([1, 2]);
    });

    it('@IdempotentWebhook: rolls the write back, and the redelivery runs and its effect is there once', async () => {
      const id = `evt_hook_${status}_${adapter}`;
      fixture.statuses.set(id, status);

      const first = await post('webhook', { id, amount: 7 });
      expect(first.status).toBe(status);
      expect(first.body).toEqual({ processed: id, failed: status });
      expect(await orders(id)).toBe(0);
      expect(await claim(id)).toEqual([expect.objectContaining({ status: 'failed' })]);

      const redelivery = await post('webhook', { id, amount: 7 });
      expect(redelivery.status).toBe(200);
      expect(redelivery.body).toEqual({ processed: id });
      expect(await orders(id)).toBe(1);
      expect(await claim(id)).toEqual([expect.objectContaining({ status: 'done', attempts: 2 })]);
      const replay = await post('webhook', { id, amount: 7 });
      expect(replay.status).toBe(200);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(runsOf(id)).toBe(2);
      expect(await orders(id)).toBe(1);
    });

    it('@IdempotentWebhook external mode: marks the attempt failed, and the redelivery runs at once', async () => {
      const id = `evt_hook_ext_${status}_${adapter}`;
      fixture.statuses.set(id, status);

      const first = await post('webhook-external', { id });
      expect(first.status).toBe(status);
      expect(first.body).toEqual({ processed: id, attempt: 1, failed: status });
      expect(await claim(id)).toEqual([expect.objectContaining({ status: 'failed', response: null })]);

      const redelivery = await post('webhook-external', { id });
      expect(redelivery.status).toBe(200);
      expect(redelivery.body).toEqual({ processed: id, attempt: 2 });
      expect(await claim(id)).toEqual([expect.objectContaining({ status: 'done', attempts: 2 })]);
      expect(await downstreamCalls(id)).toEqual([1, 2]);
    });
  });

  it('@HttpCode(503): every request rolls back and runs again; nothing is stored', async () => {
    const id = `ord_http_code_${adapter}`;
    const key = `key-http-code-${adapter}`;
    for (let attempt = 1; attempt <= 2; attempt++) {
      const answer = await post('http-code', { id }, key);
      expect(answer.status).toBe(503);
      expect(answer.body).toEqual({ unavailable: id });
      expect(answer.headers['idempotent-replayed']).toBeUndefined();
      expect(await orders(id)).toBe(0);
      expect(await claim(`user_a:${key}`)).toEqual([
        expect.objectContaining({ status: 'failed', attempts: attempt, response: null }),
      ]);
    }
    expect(runsOf(id)).toBe(2);
  });

  it('a 4xx answered (not thrown) is an answer: stored with the claim and replayed, the handler not run again', async () => {
    const id = `ord_refusal_${adapter}`;
    const key = `key-refusal-${adapter}`;
    const first = await post('refusal', { id }, key);
    expect(first.status).toBe(409);
    expect(first.body).toEqual({ conflict: id });
    expect(await claim(`user_a:${key}`)).toEqual([
      expect.objectContaining({
        status: 'done',
        attempts: 1,
        response: expect.objectContaining({ status: 409 }),
      }),
    ]);
    const retry = await post('refusal', { id }, key);
    expect(retry.status).toBe(409);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.body).toEqual(first.body);
    expect(runsOf(id)).toBe(1);
  });
});
