import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { ExpiredLeaseReporter } from '../../lib/index.js';
import { IdempotencyKeyFixtureController, SMALL_CAP_BYTES } from '../fixtures/idempotency-key.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

const DRAFT = 'https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/';

/**
 * The IETF httpapi Idempotency-Key draft, behaviour by behaviour, on a request-mode route
 * (`@IdempotentRequest`) of a real app on each adapter against real PostgreSQL. Keys are sent as
 * the draft writes them: a quoted sf-string. Each test asserts the effect (order rows, claim
 * rows), not only the status.
 */
describe.each(ADAPTERS)('Idempotency-Key draft conformance (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(
      adapter,
      [
        WebhookFixtureModule.forDatabase({
          databaseUrl: db.url,
          // A concurrent retry waits for the first this long before its 409.
          idempotency: { concurrentDuplicateWaitMs: 200 },
          controllers: [IdempotencyKeyFixtureController],
        }),
      ],
      { rawBody: true },
    );
  });

  afterEach(() => running?.app.get(Gates).openAll());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  /** The name Location is stored and sent by: as written on Express, lower case on Fastify. */
  const locationName = adapter === 'express' ? 'Location' : 'location';
  const pay = (key: string | undefined, body: object, userId = 'user_a') => {
    const sent = request(running.url).post('/api/payments').set('X-User', userId);
    return (key === undefined ? sent : sent.set('Idempotency-Key', `"${key}"`)).send(body);
  };
  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const claims = (key: string) =>
    db.count(`SELECT count(*) FROM processed_events WHERE event_key LIKE '%' || $1`, [key]);
  const expectProblem = (answer: request.Response, status: number, title: string) => {
    expect(answer.status).toBe(status);
    expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(answer.headers['content-language']).toBe('en');
    expect(answer.body).toMatchObject({ type: DRAFT, title, status });
    expect(typeof answer.body.detail).toBe('string');
  };

  it('refuses a request without the key (400, problem details) and runs nothing', async () => {
    const answer = await pay(undefined, { id: `ord_missing_${adapter}` });
    expectProblem(answer, 400, 'Idempotency-Key is missing');
    expect(answer.body.code).toBe('IDEMPOTENCY_KEY_MISSING');
    expect(await orders(`ord_missing_${adapter}`)).toBe(0);
  });

  it('refuses a key that is not an sf-string (400) and runs nothing', async () => {
    const id = `ord_bare_${adapter}`;
    const answer = await request(running.url)
      .post('/api/payments')
      .set('X-User', 'user_a')
      .set('Idempotency-Key', '8e03978e-40d5-43e8-bc93-6894a57f9324')
      .send({ id });
    expectProblem(answer, 400, 'Idempotency-Key is malformed');
    expect(await orders(id)).toBe(0);
  });

  it('replays the stored response to a retry: status, body, Location, Idempotent-Replayed', async () => {
    const id = `ord_replay_${adapter}`;
    const key = `8e03978e-replay-${adapter}`;
    const first = await pay(key, { id, amount: 500 });
    expect(first.status).toBe(201);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    expect(first.body).toMatchObject({ eventId: id, amount: 500 });
    expect(first.headers.location).toBe(`/api/payments/${first.body.id}`);

    const retry = await pay(key, { id, amount: 500 });
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.body).toEqual(first.body);
    expect(retry.headers.location).toBe(first.headers.location);
    expect(await orders(id)).toBe(1);
    const { rows } = await db.pool.query(
      `SELECT event_key, status, response FROM processed_events WHERE event_key = $1`,
      [`user_a:${key}`],
    );
    expect(rows).toEqual([
      {
        event_key: `user_a:${key}`,
        status: 'done',
        // The body's JSON text as sent, and Location by the name the handler wrote (Fastify's: lower case).
        response: { status: 201, headers: { [locationName]: first.headers.location }, json: first.text },
      },
    ]);
  });

  it('refuses the key reused with another payload (422) and runs nothing', async () => {
    const id = `ord_reuse_${adapter}`;
    const key = `8e03978e-reuse-${adapter}`;
    expect((await pay(key, { id, amount: 500 })).status).toBe(201);
    const reused = await pay(key, { id: `${id}_other`, amount: 900 });
    expectProblem(reused, 422, 'Idempotency-Key is already used');
    expect(reused.body.code).toBe('IDEMPOTENCY_KEY_REUSED');
    expect(await orders(`${id}_other`)).toBe(0);
    expect(await orders(id)).toBe(1);
  });

  it('answers a retry while the first request runs 409 + Retry-After, and the first completes once', async () => {
    const id = `ord_concurrent_${adapter}`;
    const key = `8e03978e-concurrent-${adapter}`;
    const gates = running.app.get(Gates);
    const first = pay(key, { id, block: true }).then((answer) => answer);
    await gates.entered(id);
    const retry = await pay(key, { id, block: true });
    expectProblem(retry, 409, 'A request is outstanding for this Idempotency-Key');
    expect(Number(retry.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    gates.open(id);
    expect((await first).status).toBe(201);
    expect(await orders(id)).toBe(1);
  });

  it('refuses a retry with another payload while the first runs (422), without waiting for it', async () => {
    const id = `ord_concurrent_reuse_${adapter}`;
    const key = `8e03978e-concurrent-reuse-${adapter}`;
    const gates = running.app.get(Gates);
    const first = pay(key, { id, block: true }).then((answer) => answer);
    await gates.entered(id);
    const reused = await pay(key, { id: `${id}_other` });
    expectProblem(reused, 422, 'Idempotency-Key is already used');
    gates.open(id);
    expect((await first).status).toBe(201);
    expect(await orders(`${id}_other`)).toBe(0);
  });

  it('refuses the key reused with another payload after the first failed (422), and runs the same one again', async () => {
    const id = `ord_failed_${adapter}`;
    const key = `8e03978e-failed-${adapter}`;
    expect((await pay(key, { id, fail: true })).status).toBe(500);
    const [claim] = (
      await db.pool.query('SELECT status FROM processed_events WHERE event_key = $1', [`user_a:${key}`])
    ).rows;
    expect(claim).toEqual({ status: 'failed' });
    const reused = await pay(key, { id: `${id}_other` });
    expectProblem(reused, 422, 'Idempotency-Key is already used');
    expect(await orders(`${id}_other`)).toBe(0);
    // The same request is its retry: it runs again (and fails again, as it asks to).
    expect((await pay(key, { id, fail: true })).status).toBe(500);
    expect(await orders(id)).toBe(0);
  });

  it('external mode: a retry with another payload while the lease is held is 422, the same one 409', async () => {
    const id = `ord_external_busy_${adapter}`;
    const key = `8e03978e-external-busy-${adapter}`;
    const gates = running.app.get(Gates);
    const send = (body: object) =>
      request(running.url).post('/api/payments/external').set('Idempotency-Key', `"${key}"`).send(body);
    const first = send({ id, block: true }).then((answer) => answer);
    await gates.entered(id);
    expectProblem(await send({ id: `${id}_other` }), 422, 'Idempotency-Key is already used');
    expectProblem(await send({ id, block: true }), 409, 'A request is outstanding for this Idempotency-Key');
    gates.open(id);
    expect((await first).status).toBe(201);
    expect(await db.count('SELECT count(*) FROM downstream_calls WHERE event_id LIKE $1', [`${id}%`])).toBe(
      1,
    );
  });

  it('runs the request again once its stored response has expired with the claim (retention)', async () => {
    const id = `ord_expiry_${adapter}`;
    const key = `8e03978e-expiry-${adapter}`;
    expect((await pay(key, { id })).status).toBe(201);
    // Older than retentionDays (30): retention deletes the claim and its stored response with it.
    await db.pool.query(
      `UPDATE processed_events SET completed_at = now() - interval '31 days' WHERE event_key = $1`,
      [`user_a:${key}`],
    );
    await running.app.get(ExpiredLeaseReporter).run();
    expect(await claims(key)).toBe(0);
    const again = await pay(key, { id: `${id}_again` });
    expect(again.status).toBe(201);
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    expect(await orders(`${id}_again`)).toBe(1);
  });

  it("never replays one caller's response to another: B sending A's key gets its own processing", async () => {
    const key = `8e03978e-owners-${adapter}`;
    const forA = await pay(key, { id: `ord_owner_a_${adapter}`, amount: 100 }, 'user_a');
    const forB = await pay(key, { id: `ord_owner_b_${adapter}`, amount: 100 }, 'user_b');
    expect(forA.status).toBe(201);
    expect(forB.status).toBe(201);
    expect(forB.headers['idempotent-replayed']).toBeUndefined();
    expect(forB.body.eventId).toBe(`ord_owner_b_${adapter}`);
    expect(forB.headers.location).not.toBe(forA.headers.location);
    expect(await orders(`ord_owner_a_${adapter}`)).toBe(1);
    expect(await orders(`ord_owner_b_${adapter}`)).toBe(1);
    // And each one's retry replays its own.
    const retryB = await pay(key, { id: `ord_owner_b_${adapter}`, amount: 100 }, 'user_b');
    expect(retryB.headers['idempotent-replayed']).toBe('true');
    expect(retryB.body).toEqual(forB.body);
  });

  it('runs a request without the key on a route that does not require one, with no claim', async () => {
    const id = `ord_optional_${adapter}`;
    const answer = await request(running.url).post('/api/payments/optional').send({ id });
    expect(answer.status).toBe(201);
    expect(await db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [id])).toBe(1);
    expect(await db.count(`SELECT count(*) FROM processed_events WHERE scope LIKE '%optional'`)).toBe(0);
    // With a key, the same route claims.
    const keyed = () =>
      request(running.url).post('/api/payments/optional').set('Idempotency-Key', `"${id}"`).send({ id });
    expect((await keyed()).status).toBe(201);
    expect((await keyed()).headers['idempotent-replayed']).toBe('true');
    expect(await orders(id)).toBe(1);
  });

  it('rolls a request back whose body is over the cap (500, problem details): no order, no claim', async () => {
    const id = `ord_cap_${adapter}`;
    const key = `8e03978e-cap-${adapter}`;
    const answer = await request(running.url)
      .post('/api/payments/small-cap')
      .set('Idempotency-Key', `"${key}"`)
      .send({ id, padding: SMALL_CAP_BYTES });
    expect(answer.status).toBe(500);
    expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(answer.body).toMatchObject({ type: 'about:blank', code: 'IDEMPOTENCY_RESPONSE_NOT_STORED' });
    expect(answer.body.detail).toContain('maxStoredResponseBytes');
    expect(await orders(id)).toBe(0);
    expect(
      await db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [key]),
    ).toBe(0);
    // Its retry runs again (the claim is failed, not done) and fails the same way: nothing stays.
    const retry = await request(running.url)
      .post('/api/payments/small-cap')
      .set('Idempotency-Key', `"${key}"`)
      .send({ id, padding: SMALL_CAP_BYTES });
    expect(retry.status).toBe(500);
    expect(await orders(id)).toBe(0);
    // Under the cap, a request is stored and replayed.
    const small = () =>
      request(running.url)
        .post('/api/payments/small-cap')
        .set('Idempotency-Key', `"${key}-small"`)
        .send({ id });
    expect((await small()).status).toBe(201);
    expect((await small()).headers['idempotent-replayed']).toBe('true');
    expect(await orders(id)).toBe(1);
  });

  it('external mode: the fenced completion stores the response, and a retry replays it without the work', async () => {
    const id = `ord_external_${adapter}`;
    const key = `8e03978e-external-${adapter}`;
    const send = (body: object) =>
      request(running.url).post('/api/payments/external').set('Idempotency-Key', `"${key}"`).send(body);
    const first = await send({ id });
    expect(first.status).toBe(201);
    expect(first.headers.location).toBe('/api/payments/external');
    const retry = await send({ id });
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.body).toEqual(first.body);
    expect(await db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [id])).toBe(1);
  });

  it('external mode: a body over the cap is left out (the work happened); the replay answers status and headers', async () => {
    const id = `ord_external_cap_${adapter}`;
    const key = `8e03978e-external-cap-${adapter}`;
    const send = (body: object) =>
      request(running.url).post('/api/payments/external').set('Idempotency-Key', `"${key}"`).send(body);
    const first = await send({ id, padding: SMALL_CAP_BYTES });
    expect(first.status).toBe(201);
    expect(first.body.padding).toHaveLength(SMALL_CAP_BYTES);
    const retry = await send({ id, padding: SMALL_CAP_BYTES });
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.headers.location).toBe('/api/payments/external');
    expect(retry.text).toBe('');
    expect(await db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [id])).toBe(1);
    const { rows } = await db.pool.query(`SELECT response FROM processed_events WHERE event_key = $1`, [key]);
    expect(rows[0].response).toEqual({
      status: 201,
      headers: { [locationName]: '/api/payments/external' },
      omitted: 'too_large',
    });
  });
});
