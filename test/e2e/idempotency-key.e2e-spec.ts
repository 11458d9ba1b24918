import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { ExpiredLeaseReporter } from '../../lib/index.js';
import { IdempotencyKeyBodiesFixtureController } from '../fixtures/idempotency-key-bodies.fixture.js';
import { IdempotencyKeyFixtureController, SMALL_CAP_BYTES } from '../fixtures/idempotency-key.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

const DRAFT = 'https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/';

/**
 * The IETF httpapi Idempotency-Key draft, behaviour by behaviour, on a request-mode route
 * (`@IdempotentRequest`) of a real app on each adapter against real PostgreSQL. Keys are sent as
 * the draft writes them, a quoted sf-string, but where a test says otherwise. Each test asserts the effect (order rows, claim
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
          controllers: [IdempotencyKeyFixtureController, IdempotencyKeyBodiesFixtureController],
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

  it('accepts a bare key (a UUID, as most clients send it) as the same key as its quoted form', async () => {
    const id = `ord_bare_${adapter}`;
    const key = `8e03978e-40d5-43e8-bc93-bare-${adapter}`;
    const bare = await request(running.url)
      .post('/api/payments')
      .set('X-User', 'user_a')
      .set('Idempotency-Key', key)
      .send({ id });
    expect(bare.status).toBe(201);
    const quoted = await pay(key, { id });
    expect(quoted.status).toBe(201);
    expect(quoted.headers['idempotent-replayed']).toBe('true');
    expect(quoted.body).toEqual(bare.body);
    expect(await orders(id)).toBe(1);
    expect(
      await db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [`user_a:${key}`]),
    ).toBe(1);
  });

  it.each([
    ['with a space', 'two words'],
    ['two keys (a repeated header)', ['k1', 'k2']],
    ['an unterminated string', '"k1'],
    ['a quote inside', 'k"1'],
  ])('refuses a key that is neither quoted nor bare, %s (400), and runs nothing', async (what, header) => {
    const id = `ord_malformed_${adapter}_${what.replace(/\W/g, '_')}`;
    const answer = await request(running.url)
      .post('/api/payments')
      .set('X-User', 'user_a')
      // An array sends the header twice (superagent's types take one string).
      .set('Idempotency-Key', header as string)
      .send({ id });
    expectProblem(answer, 400, 'Idempotency-Key is malformed');
    expect(answer.body.detail).toContain('bare key');
    expect(await orders(id)).toBe(0);
  });

  it('strictKeySyntax: a bare key is refused 400 naming the draft syntax, the quoted one runs', async () => {
    const id = `ord_strict_${adapter}`;
    const key = `8e03978e-strict-${adapter}`;
    const send = (header: string) =>
      request(running.url).post('/api/payments/strict').set('Idempotency-Key', header).send({ id });
    const bare = await send(key);
    expectProblem(bare, 400, 'Idempotency-Key is malformed');
    expect(bare.body.detail).toContain('quoted string');
    expect(await orders(id)).toBe(0);
    expect((await send(`"${key}"`)).status).toBe(201);
    expect(await orders(id)).toBe(1);
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

  it("never echoes the owner in a refusal: 422, 409 and 500 name the client's key alone", async () => {
    const key = `8e03978e-echo-${adapter}`;
    const id = `ord_echo_${adapter}`;
    const owner = `owner_secret_${adapter}`;
    const gates = running.app.get(Gates);
    const expectNoOwner = (answer: request.Response) => {
      expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(answer.body.detail).toContain(key);
      expect(JSON.stringify(answer.body)).not.toContain(owner);
      expect(JSON.stringify(answer.headers)).not.toContain(owner);
    };
    const first = pay(key, { id, block: true }, owner).then((answer) => answer);
    await gates.entered(id);
    const inFlight = await pay(key, { id, block: true }, owner);
    expectProblem(inFlight, 409, 'A request is outstanding for this Idempotency-Key');
    expectNoOwner(inFlight);
    gates.open(id);
    expect((await first).status).toBe(201);
    const reused = await pay(key, { id: `${id}_other` }, owner);
    expectProblem(reused, 422, 'Idempotency-Key is already used');
    expectNoOwner(reused);
    // A refusal the strategy words (its message names the claim's key, owner and all): a handler
    // that went on after a failed statement, answered 500 (transaction aborted) as
    // docs/transports.md says; nothing is written and the owner is not named.
    const aborted = await pay(`${key}-aborted`, { id: `${id}_aborted`, abort: true }, owner);
    expect(aborted.status).toBe(500);
    expect(aborted.body.code).toBe('IDEMPOTENCY_TRANSACTION_ABORTED');
    expectNoOwner(aborted);
    expect(await orders(`${id}_other`)).toBe(0);
    expect(await orders(`${id}_aborted`)).toBe(0);
  });

  it('takes an owner of any length: 10,000 characters are processed, replayed, and kept apart from another sharing a prefix', async () => {
    const key = `8e03978e-long-owner-${adapter}`;
    const prefix = 'o'.repeat(9_999);
    const [ownerA, ownerB] = [`${prefix}a`, `${prefix}b`];
    const forA = await pay(key, { id: `ord_long_a_${adapter}`, amount: 100 }, ownerA);
    const forB = await pay(key, { id: `ord_long_b_${adapter}`, amount: 100 }, ownerB);
    expect(forA.status).toBe(201);
    expect(forB.status).toBe(201);
    expect(forB.headers['idempotent-replayed']).toBeUndefined();
    expect(forB.body.eventId).toBe(`ord_long_b_${adapter}`);
    const retryA = await pay(key, { id: `ord_long_a_${adapter}`, amount: 100 }, ownerA);
    expect(retryA.status).toBe(201);
    expect(retryA.headers['idempotent-replayed']).toBe('true');
    expect(retryA.body).toEqual(forA.body);
    expect(await orders(`ord_long_a_${adapter}`)).toBe(1);
    expect(await orders(`ord_long_b_${adapter}`)).toBe(1);
    // Each long owner stands in its claim's key as a hash of a fixed length, one claim each.
    const { rows } = await db.pool.query(
      'SELECT event_key FROM processed_events WHERE event_key LIKE $1 ORDER BY event_key',
      [`%:${key}`],
    );
    expect(rows).toHaveLength(2);
    for (const row of rows) expect(row.event_key).toMatch(new RegExp(`^sha256=[0-9a-f]{64}:${key}$`));
    // The key's own limit stays: a key of 256 characters is refused 400, writing nothing.
    const tooLong = await pay('k'.repeat(256), { id: `ord_long_key_${adapter}` }, ownerA);
    expectProblem(tooLong, 400, 'Idempotency-Key is malformed');
    expect(await orders(`ord_long_key_${adapter}`)).toBe(0);
  });

  it("a text/plain body under Nest's default parsers (rawBody: true) is never fingerprinted as nothing", async () => {
    // Express parses no text/plain by default: the body is unseen, so 415 and nothing runs. Fastify
    // parses it as text: another body under the key is 422.
    const key = `text-plain-${adapter}`;
    const send = (order: string, body: string) =>
      request(running.url)
        .post('/api/bodies')
        .set('Idempotency-Key', `"${key}"`)
        .set('X-Order', order)
        .set('Content-Type', 'text/plain')
        .send(body);
    const first = await send(`ord_text_10_${adapter}`, 'refund 10');
    const second = await send(`ord_text_99999_${adapter}`, 'refund 99999');
    if (adapter === 'express') {
      expect(first.status).toBe(415);
      expect(first.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(first.body).toMatchObject({ status: 415, code: 'IDEMPOTENCY_BODY_UNPARSED' });
      expect(first.body.detail).toContain('text/plain');
      expect(second.status).toBe(415);
      expect(await claims(key)).toBe(0);
    } else {
      expect(first.status).toBe(201);
      expectProblem(second, 422, 'Idempotency-Key is already used');
    }
    expect(await orders(`ord_text_99999_${adapter}`)).toBe(0);
    expect(await orders(`ord_text_10_${adapter}`)).toBe(adapter === 'express' ? 0 : 1);
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
