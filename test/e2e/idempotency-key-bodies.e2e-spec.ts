import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import { createHash } from 'node:crypto';
import request from 'supertest';
import {
  addBodyParsers,
  IdempotencyKeyBodiesFixtureController,
  STREAMED_TYPE,
} from '../fixtures/idempotency-key-bodies.fixture.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, type AdapterName } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/** The app with `rawBody: true` and the parsers of addBodyParsers(), listening on a free port. */
async function startWithParsers(adapter: AdapterName, databaseUrl: string) {
  const moduleRef = await Test.createTestingModule({
    imports: [
      WebhookFixtureModule.forDatabase({ databaseUrl, controllers: [IdempotencyKeyBodiesFixtureController] }),
    ],
  }).compile();
  const options = { logger: false as const, rawBody: true };
  const app: INestApplication =
    adapter === 'fastify'
      ? moduleRef.createNestApplication(new FastifyAdapter(), options)
      : moduleRef.createNestApplication(options);
  addBodyParsers(app, adapter);
  await app.listen(0, '127.0.0.1');
  if (adapter === 'fastify') await (app.getHttpAdapter().getInstance() as { ready(): Promise<void> }).ready();
  return { app, url: await app.getUrl() };
}

/**
 * What a request's fingerprint sees of bodies that are not JSON: the bytes the client sent and
 * their Content-Type, on a request-mode route of an app that parses text, XML and bytes (and
 * keeps raw bodies). Two bodies under one key are 422, the same bytes a replay, a Content-Type
 * change alone 422, and a body no parser read 415 with nothing written. Each test counts the
 * `orders` rows and claims, not only the status.
 */
describe.each(ADAPTERS)('request mode: the fingerprint of bodies that are not JSON (%s)', (adapter) => {
  let db: TestDatabase;
  let running: { app: INestApplication; url: string };

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startWithParsers(adapter, db.url);
  });

  afterAll(async () => {
    await running?.app.close();
    await db?.drop();
  });

  const send = (key: string, order: string, type: string, body: string | Buffer) =>
    request(running.url)
      .post('/api/bodies')
      .set('Idempotency-Key', `"${key}"`)
      .set('X-Order', order)
      .set('Content-Type', type)
      .send(body);
  const orders = (order: string) =>
    db.count('SELECT count(*) FROM orders WHERE event_id LIKE $1', [`${order}%`]);
  const claims = (key: string) =>
    db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [key]);

  it.each([
    ['text/plain', 'refund 10', 'refund 99999'],
    ['application/xml', '<refund amount="10"/>', '<refund amount="99999"/>'],
    ['application/octet-stream', Buffer.from([1, 2, 3, 10]), Buffer.from([1, 2, 3, 99])],
  ] as const)(
    '%s: another body under the key is 422 and runs nothing; the same bytes are replayed',
    async (type, first, other) => {
      const key = `bodies-${type}-${adapter}`;
      const order = `ord_${type}_${adapter}`;
      const processed = await send(key, `${order}_first`, type, first);
      expect(processed.status).toBe(201);
      expect(processed.body.bytes).toBe(Buffer.byteLength(first));

      const reused = await send(key, `${order}_other`, type, other);
      expect(reused.status).toBe(422);
      expect(reused.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(reused.body.code).toBe('IDEMPOTENCY_KEY_REUSED');

      const retry = await send(key, `${order}_first`, type, first);
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.body).toEqual(processed.body);
      expect(await orders(`${order}_first`)).toBe(1);
      expect(await orders(`${order}_other`)).toBe(0);
    },
  );

  it.each([
    ['text/plain', 'application/xml', '<refund/>'],
    ['application/json', 'text/plain', '{"amount":10}'],
    ['application/octet-stream', 'text/plain', 'abc'],
  ])('the same bytes as %s, then as %s: another request (422), nothing runs', async (type, other, bytes) => {
    const key = `bodies-type-${type}-${other}-${adapter}`;
    const order = `ord_type_${type}_${other}_${adapter}`;
    expect((await send(key, order, type, bytes)).status).toBe(201);
    const changed = await send(key, `${order}_changed`, other, bytes);
    expect(changed.status).toBe(422);
    expect(changed.body.code).toBe('IDEMPOTENCY_KEY_REUSED');
    expect(await orders(`${order}_changed`)).toBe(0);
    // Parameters are no part of the media type: the same bytes with a charset are the same request.
    const charset = await send(key, order, `${type.toUpperCase()}; charset=utf-8`, bytes);
    expect(charset.status).toBe(201);
    expect(charset.headers['idempotent-replayed']).toBe('true');
    expect(await orders(order)).toBe(1);
  });

  it('a body no parser read (the handler would read the stream) is 415 naming its type, with nothing written', async () => {
    const key = `bodies-streamed-${adapter}`;
    const order = `ord_streamed_${adapter}`;
    const answer = await send(key, order, STREAMED_TYPE, 'part one; part two');
    expect(answer.status).toBe(415);
    expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(answer.body).toMatchObject({
      type: 'about:blank',
      title: 'Unsupported Media Type',
      status: 415,
      code: 'IDEMPOTENCY_BODY_UNPARSED',
    });
    expect(answer.body.detail).toContain(STREAMED_TYPE);
    expect(answer.body.detail).toContain('useBodyParser');
    expect(await orders(order)).toBe(0);
    expect(await claims(key)).toBe(0);
  });

  it('a type no parser takes is 415 with nothing written (Fastify refuses it before the route)', async () => {
    const key = `bodies-unknown-${adapter}`;
    const order = `ord_unknown_${adapter}`;
    const answer = await send(key, order, 'application/x-unknown', 'refund 10');
    expect(answer.status).toBe(415);
    expect(await orders(order)).toBe(0);
    expect(await claims(key)).toBe(0);
  });

  it('a JSON request keeps the fingerprint earlier releases stored: method, URL and raw body', async () => {
    // Claims stored before the Content-Type was part of the fingerprint still match their retries.
    const key = `bodies-json-${adapter}`;
    // Compact JSON: the same bytes whether the app kept the raw body or the library serialised
    // the parsed one again. On Nest 11, Fastify's useBodyParser() marks the parsers registered, so
    // addBodyParsers() leaves JSON to Fastify's own parser and `rawBody` is not kept for it.
    const bytes = '{"amount":10}';
    expect((await send(key, `ord_json_${adapter}`, 'application/json', bytes)).status).toBe(201);
    const { rows } = await db.pool.query('SELECT fingerprint FROM processed_events WHERE event_key = $1', [
      key,
    ]);
    const earlier = createHash('sha256').update(`POST\n/api/bodies\n${bytes}`).digest('hex');
    expect(rows).toEqual([{ fingerprint: earlier }]);
  });
});
