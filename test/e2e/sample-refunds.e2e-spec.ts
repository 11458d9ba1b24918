import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { killAllSamples, startSample, type SampleProcess } from '../support/sample-process.js';

/**
 * The sample's own API route, `POST /refunds`, as a client of it sees it: the built sample in its
 * own process, real Postgres, keys sent as the draft writes them (a quoted sf-string), the caller
 * named by `Authorization: Bearer <user id>`. Each test asserts the `refunds` rows, not only the
 * status.
 */
describe('sample: POST /refunds with Idempotency-Key', () => {
  let db: TestDatabase;
  let sample: SampleProcess;

  beforeAll(async () => {
    db = await createTestDatabase(undefined, { fixtureSchema: false });
    sample = await startSample({ databaseUrl: db.url });
  });

  afterAll(async () => {
    await killAllSamples();
    await db?.drop();
  });

  const refund = (user: string | undefined, key: string | undefined, body: object) => {
    let sent = request(sample.url).post('/refunds');
    if (user !== undefined) sent = sent.set('Authorization', `Bearer ${user}`);
    if (key !== undefined) sent = sent.set('Idempotency-Key', `"${key}"`);
    return sent.send(body);
  };
  const rows = async (paymentIntentId: string) =>
    (
      await db.pool.query(
        'SELECT id, user_id, payment_intent_id, amount FROM refunds WHERE payment_intent_id = $1 ORDER BY id',
        [paymentIntentId],
      )
    ).rows;

  it('answers 201 with the row and its Location, and a retry the same 201, body and Location, replayed', async () => {
    const key = '8e03978e-40d5-43e8-bc93-6894a57f9324';
    const first = await refund('user_42', key, { paymentIntentId: 'pi_first', amount: 500 });
    expect(first.status).toBe(201);
    const [row] = await rows('pi_first');
    expect(row).toEqual({ id: row.id, user_id: 'user_42', payment_intent_id: 'pi_first', amount: 500 });
    expect(first.body).toEqual(row);
    expect(first.headers.location).toBe(`/refunds/${row.id}`);
    expect(first.headers['idempotent-replayed']).toBeUndefined();

    const retry = await refund('user_42', key, { paymentIntentId: 'pi_first', amount: 500 });
    expect(retry.status).toBe(201);
    expect(retry.body).toEqual(first.body);
    expect(retry.headers.location).toBe(first.headers.location);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(await rows('pi_first')).toHaveLength(1);
  });

  it('refuses the key with another body (422), no key (400) and no bearer (401), writing nothing', async () => {
    const key = '2b1c9c6e-reuse';
    expect((await refund('user_42', key, { paymentIntentId: 'pi_reuse', amount: 500 })).status).toBe(201);
    const reused = await refund('user_42', key, { paymentIntentId: 'pi_reuse', amount: 900 });
    expect(reused.status).toBe(422);
    expect(reused.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(reused.body).toMatchObject({ title: 'Idempotency-Key is already used', status: 422 });
    const missing = await refund('user_42', undefined, { paymentIntentId: 'pi_missing', amount: 500 });
    expect(missing.status).toBe(400);
    expect(missing.body).toMatchObject({ title: 'Idempotency-Key is missing' });
    const anonymous = await refund(undefined, 'anonymous-key', {
      paymentIntentId: 'pi_anonymous',
      amount: 500,
    });
    expect(anonymous.status).toBe(401);
    expect(await rows('pi_reuse')).toHaveLength(1);
    expect(await rows('pi_missing')).toHaveLength(0);
    expect(await rows('pi_anonymous')).toHaveLength(0);
  });

  it("gives user B sending user A's key B's own refund, never A's response", async () => {
    const key = 'shared-key-1';
    const forA = await refund('user_a', key, { paymentIntentId: 'pi_shared', amount: 500 });
    const forB = await refund('user_b', key, { paymentIntentId: 'pi_shared', amount: 500 });
    expect(forA.status).toBe(201);
    expect(forB.status).toBe(201);
    expect(forB.headers['idempotent-replayed']).toBeUndefined();
    expect(forB.body.user_id).toBe('user_b');
    expect(forB.headers.location).not.toBe(forA.headers.location);
    expect((await rows('pi_shared')).map((row) => row.user_id)).toEqual(['user_a', 'user_b']);
  });

  it('refuses a body that is not a refund request (400 naming the field), writing nothing', async () => {
    const answer = await refund('user_42', 'bad-body', { paymentIntentId: 'pi_bad', amount: 'five' });
    expect(answer.status).toBe(400);
    expect(answer.body.message).toContain('amount');
    expect(await rows('pi_bad')).toHaveLength(0);
  });

  it('takes a bare key, as most clients send a UUID, as the same key as its quoted form', async () => {
    const key = '0d7f4f2c-6a51-4c8e-9a3b-5f1e2d3c4b5a';
    const bare = await request(sample.url)
      .post('/refunds')
      .set('Authorization', 'Bearer user_42')
      .set('Idempotency-Key', key)
      .send({ paymentIntentId: 'pi_bare', amount: 500 });
    expect(bare.status).toBe(201);
    const quoted = await refund('user_42', key, { paymentIntentId: 'pi_bare', amount: 500 });
    expect(quoted.status).toBe(201);
    expect(quoted.headers['idempotent-replayed']).toBe('true');
    expect(quoted.body).toEqual(bare.body);
    expect(await rows('pi_bare')).toHaveLength(1);
  });

  it('refuses a bearer token longer than a user id 401 naming the limit, never 500, writing nothing', async () => {
    for (const length of [256, 10_000]) {
      const answer = await refund('u'.repeat(length), `long-token-${length}`, {
        paymentIntentId: `pi_long_${length}`,
        amount: 500,
      });
      expect(answer.status).toBe(401);
      expect(answer.body.message).toContain('at most 255 characters');
      expect(await rows(`pi_long_${length}`)).toHaveLength(0);
    }
    // The longest user id is a user: processed, and its retry replayed.
    const longest = 'u'.repeat(255);
    const first = await refund(longest, 'long-token-255', { paymentIntentId: 'pi_long_255', amount: 500 });
    expect(first.status).toBe(201);
    const retry = await refund(longest, 'long-token-255', { paymentIntentId: 'pi_long_255', amount: 500 });
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(await rows('pi_long_255')).toHaveLength(1);
  });

  it('refuses a body its parsers do not read (text/plain) 415, problem details naming it, writing nothing', async () => {
    const answer = await request(sample.url)
      .post('/refunds')
      .set('Authorization', 'Bearer user_42')
      .set('Idempotency-Key', '"text-body"')
      .set('Content-Type', 'text/plain')
      .send('refund pi_text 500');
    expect(answer.status).toBe(415);
    expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(answer.body).toMatchObject({ code: 'IDEMPOTENCY_BODY_UNPARSED', status: 415 });
    expect(answer.body.detail).toContain('text/plain');
    expect(await db.count(`SELECT count(*) FROM processed_events WHERE event_key LIKE '%:text-body'`)).toBe(
      0,
    );
  });

  it('never echoes the caller in a refusal: the 422 names the key alone', async () => {
    const key = 'echo-key-1';
    expect((await refund('user_secret_7', key, { paymentIntentId: 'pi_echo', amount: 500 })).status).toBe(
      201,
    );
    const reused = await refund('user_secret_7', key, { paymentIntentId: 'pi_echo', amount: 900 });
    expect(reused.status).toBe(422);
    expect(reused.body.detail).toContain(key);
    expect(JSON.stringify(reused.body)).not.toContain('user_secret_7');
  });
});
