import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { MAX_CLAIM_KEY_BYTES } from '../../lib/core/idempotency-key.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { BadInputController, OVERLONG_KEY } from '../fixtures/bad-input.fixture.js';
import { FixtureController, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { keyTooManyBytes } from '../../lib/core/idempotency-key.js';

/**
 * Every bad input is answered 400 with a message naming the problem, before anything is written
 * and without calling the handler: a bad key must never be claimed (the sender would be told
 * "done") and never be processed unclaimed.
 */
describe.each(ADAPTERS)('bad input (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let tight: RunningApp;
  /** maxKeyLength far above the default: only the claims index's byte bound limits a key. */
  let roomy: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    const controllers = [FixtureController, BadInputController];
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({ databaseUrl: db.url, controllers }),
    ]);
    tight = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers,
        idempotency: { maxKeyLength: 16 },
      }),
    ]);
    roomy = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers,
        idempotency: { maxKeyLength: 100_000 },
      }),
    ]);
  });

  afterAll(async () => {
    await running?.close();
    await tight?.close();
    await roomy?.close();
    await db?.drop();
  });

  const totalCalls = () =>
    [running, tight, roomy]
      .flatMap(({ app }) => [...app.get(BadInputController).calls.values()])
      .reduce((sum, calls) => sum + calls, 0);
  const written = async () => ({
    claims: await db.count('SELECT count(*) FROM processed_events'),
    orders: await db.count('SELECT count(*) FROM orders'),
    downstream: await db.count('SELECT count(*) FROM downstream_calls'),
    calls: totalCalls(),
  });

  /** Sends `send` and checks the 400, its message, and that nothing was written or called. */
  const expectRejected = async (send: () => PromiseLike<request.Response>, message: RegExp | string) => {
    const before = await written();
    const answer = await send();
    expect(answer.status).toBe(400);
    if (typeof message === 'string') expect(answer.body.message).toBe(message);
    else expect(String(answer.body.message)).toMatch(message);
    expect(await written()).toEqual(before);
  };

  it('processes a good key on the same routes (the control)', async () => {
    const answer = await request(running.url)
      .post('/bad/by-id')
      .send({ id: `evt_good_${adapter}` });
    expect(answer.status).toBe(200);
    expect(running.app.get(BadInputController).calls.get('by-id')).toBe(1);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [`evt_good_${adapter}`])).toBe(
      1,
    );
  });

  it('rejects a key extractor that throws', async () => {
    await expectRejected(
      () => request(running.url).post('/bad/throws').send({ id: 'evt_1' }),
      'Idempotency key extractor of BadInputController.throws threw: signature header missing',
    );
  });

  it('rejects a key that is not a string', async () => {
    await expectRejected(
      () => request(running.url).post('/bad/number').send({ id: 'evt_1' }),
      'Idempotency key of BadInputController.number must be a string, got number',
    );
    await expectRejected(
      () => request(running.url).post('/bad/null').send({ id: 'evt_1' }),
      'Idempotency key of BadInputController.nullKey must be a string, got null',
    );
  });

  it('rejects an empty key', async () => {
    await expectRejected(
      () => request(running.url).post('/bad/empty').send({ id: 'evt_1' }),
      'Idempotency key of BadInputController.empty is empty',
    );
  });

  it('rejects a key containing a NUL character, which PostgreSQL text cannot store', async () => {
    await expectRejected(
      () => request(running.url).post('/bad/by-id').send({ id: 'evt_\u0000nul' }),
      'Idempotency key of BadInputController.byId contains a NUL character, which PostgreSQL text cannot store',
    );
    await expectRejected(
      () => request(running.url).post('/orders').send({ id: '\u0000' }),
      'Idempotency key of FixtureController.order contains a NUL character, which PostgreSQL text cannot store',
    );
    await expectRejected(
      () => request(running.url).post('/external').send({ id: 'evt_nul_\u0000' }),
      'Idempotency key of FixtureController.external contains a NUL character, which PostgreSQL text cannot store',
    );
  });

  it('rejects a key with a lone UTF-16 surrogate, which UTF-8 encoding would turn into U+FFFD', async () => {
    // JSON.stringify escapes a lone surrogate (\ud800), so the server parses it back as sent:
    // stored, 'evt_\ud800' and 'evt_\udfff' would both become 'evt_\ufffd', one claim.
    const byId =
      'Idempotency key of BadInputController.byId contains a lone UTF-16 surrogate; stored as UTF-8 it would become U+FFFD and collide with other keys';
    await expectRejected(() => request(running.url).post('/bad/by-id').send({ id: 'evt_\ud800' }), byId);
    await expectRejected(() => request(running.url).post('/bad/by-id').send({ id: 'evt_\udfff' }), byId);
    // A pair in the wrong order is two lone surrogates; so is a high one in the middle.
    await expectRejected(
      () => request(running.url).post('/bad/by-id').send({ id: 'evt_\ude00\ud83d' }),
      byId,
    );
    await expectRejected(() => request(running.url).post('/bad/by-id').send({ id: 'evt_\udbffx' }), byId);
    await expectRejected(
      () => request(running.url).post('/orders').send({ id: 'evt_\udfff' }),
      'Idempotency key of FixtureController.order contains a lone UTF-16 surrogate; stored as UTF-8 it would become U+FFFD and collide with other keys',
    );
    await expectRejected(
      () => request(running.url).post('/external').send({ id: 'evt_\ud800' }),
      'Idempotency key of FixtureController.external contains a lone UTF-16 surrogate; stored as UTF-8 it would become U+FFFD and collide with other keys',
    );
  });

  it('processes keys with well-formed surrogate pairs (emoji) as distinct keys (the control)', async () => {
    // U+1F600 and U+1F601: the same high surrogate, different low ones.
    const keys = [`evt_\u{1F600}_${adapter}`, `evt_\u{1F601}_${adapter}`];
    const controller = running.app.get(BadInputController);
    for (const id of keys) {
      const calls = controller.calls.get('by-id') ?? 0;
      const answer = await request(running.url).post('/bad/by-id').send({ id });
      expect(answer.status).toBe(200);
      expect(answer.body).toEqual({ processed: id });
      expect(controller.calls.get('by-id')).toBe(calls + 1);
    }
    const { rows } = await db.pool.query(
      `SELECT event_key, status FROM processed_events WHERE event_key = ANY($1) ORDER BY event_key COLLATE "C"`,
      [keys],
    );
    expect(rows).toEqual(keys.map((event_key) => ({ event_key, status: 'done' })));
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = ANY($1)', [keys])).toBe(2);
  });

  it('rejects a key longer than maxKeyLength (default 255)', async () => {
    await expectRejected(
      () => request(running.url).post('/bad/long').send({ id: 'evt_1' }),
      `Idempotency key of BadInputController.long is ${OVERLONG_KEY.length} characters long; the maximum is 255`,
    );
    await expectRejected(
      () =>
        request(running.url)
          .post('/orders')
          .send({ id: 'x'.repeat(256) }),
      'Idempotency key of FixtureController.order is 256 characters long; the maximum is 255',
    );
  });

  it('applies a configured maxKeyLength, accepting a key of exactly that length', async () => {
    await expectRejected(
      () =>
        request(tight.url)
          .post('/bad/by-id')
          .send({ id: 'k'.repeat(17) }),
      'Idempotency key of BadInputController.byId is 17 characters long; the maximum is 16',
    );
    const fits = 'k'.repeat(16);
    expect((await request(tight.url).post('/bad/by-id').send({ id: fits })).status).toBe(200);
    expect(await db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [fits])).toBe(1);
  });

  /** `length` characters from `alphabet`, pseudo-random from `seed`: a key PostgreSQL cannot compress. */
  const incompressible = (alphabet: string, length: number, seed: number) => {
    let state = seed;
    return Array.from({ length }, () => {
      state = (state * 1103515245 + 12345) % 2 ** 31;
      // The high bits: an LCG's low bits repeat within a few steps, which compresses.
      return alphabet[Math.floor(state / 2 ** 15) % alphabet.length];
    }).join('');
  };
  const CJK = Array.from({ length: 2000 }, (_, index) => String.fromCharCode(0x4e00 + index)).join('');
  const ASCII = Array.from({ length: 90 }, (_, index) => String.fromCharCode(0x21 + index)).join('');

  it('rejects a key too large for the claims index, which a raised maxKeyLength lets through', async () => {
    // 1000 CJK characters are 3000 bytes of UTF-8: PostgreSQL refuses such an index entry, which
    // answered 503 "database unavailable" on every delivery, a retry loop that never ends.
    const key = incompressible(CJK, 1000, 7);
    for (const [path, scope] of [
      ['/orders', 'FixtureController.order'],
      ['/external', 'FixtureController.external'],
      ['/bad/by-id', 'BadInputController.byId'],
    ]) {
      await expectRejected(
        () => request(roomy.url).post(path).send({ id: key }),
        keyTooManyBytes(scope, 3000, scope.length, MAX_CLAIM_KEY_BYTES),
      );
    }
  });

  it('accepts an incompressible key that fills the bound exactly (the control)', async () => {
    const scope = 'FixtureController.order';
    const key = incompressible(ASCII, MAX_CLAIM_KEY_BYTES - scope.length, adapter.length);
    const answer = await request(roomy.url).post('/orders').send({ id: key });
    expect(answer.status).toBe(200);
    expect(answer.body).toEqual({ processed: key });
    const { rows } = await db.pool.query(
      'SELECT status FROM processed_events WHERE scope = $1 AND event_key = $2',
      [scope, key],
    );
    expect(rows).toEqual([{ status: 'done' }]);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [key])).toBe(1);
  });

  it('rejects a body without the key field', async () => {
    await expectRejected(
      () => request(running.url).post('/orders').send({ amount: 3 }),
      'Idempotency key of FixtureController.order must be a string, got undefined',
    );
    await expectRejected(
      () => request(running.url).post('/bad/by-id').send({ amount: 3 }),
      'Idempotency key of BadInputController.byId must be a string, got undefined',
    );
  });

  it('rejects a body that is not JSON (the platform parser answers)', async () => {
    await expectRejected(
      () =>
        request(running.url)
          .post('/bad/by-id')
          .set('Content-Type', 'application/json')
          .send('{"id": "evt_1",'),
      /JSON/,
    );
  });

  it('rejects a delivery without a body', async () => {
    // No body at all: the key extractor reads a property of undefined and throws.
    await expectRejected(
      () => request(running.url).post('/bad/by-id'),
      /^Idempotency key extractor of BadInputController\.byId threw: /,
    );
  });

  it('rejects an empty body declared as JSON', async () => {
    // Express parses it to {} (no key); Fastify's parser refuses it before Nest runs.
    await expectRejected(
      () => request(running.url).post('/bad/by-id').set('Content-Type', 'application/json'),
      adapter === 'express'
        ? 'Idempotency key of BadInputController.byId must be a string, got undefined'
        : "Body cannot be empty when content-type is set to 'application/json'",
    );
  });
});
