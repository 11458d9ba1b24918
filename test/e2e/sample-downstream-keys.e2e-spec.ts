import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { FakeFulfilmentApi } from '../support/sample-downstream.js';
import { killAllSamples, startSample, type SampleProcess } from '../support/sample-process.js';
import {
  checkoutSessionCompleted,
  deliver,
  FULFILMENT,
  FULFILMENT_ASYNC,
  ORDERS,
  paymentIntentSucceeded,
} from '../support/sample-stripe.js';
import { waitUntil } from '../support/wait-until.js';

/** The sample's queue (its pg-boss schema is the default). */
const QUEUE = 'stripe-fulfilment';
/** A job's first attempt, with the sample's polling: well within this. */
const FULFILLED_MS = 30_000;

/**
 * The header-safe form the API must see, computed here on its own: the id itself when it is
 * visible ASCII (and short, and not `sha256-...`), else `sha256-` and the base64url SHA-256 of its
 * UTF-8 bytes.
 */
const downstreamFormOf = (id: string) =>
  /^[\x21-\x7e]{1,255}$/.test(id) && !id.startsWith('sha256-')
    ? id
    : `sha256-${createHash('sha256').update(Buffer.from(id, 'utf8')).digest('base64url')}`;

/**
 * Signed Stripe events whose ids no HTTP header can carry as they are, through the built sample
 * and its counting fulfilment API. Before, the sample copied the id into the API call's
 * `Idempotency-Key`: for an id above U+00FF fetch refused the call, so /fulfilment answered 502 on
 * every delivery and /fulfilment-async answered 200 and then failed every worker attempt until the
 * event was poison. Now the sample sends `IdempotencyContext.downstreamKey`, the same on every
 * attempt; an id with a control character, which could never be sent, is refused at the claim.
 */
describe('Stripe sample: event ids a header cannot carry as they are', () => {
  let db: TestDatabase;
  let api: FakeFulfilmentApi;
  let sample: SampleProcess;

  beforeAll(async () => {
    db = await createTestDatabase(undefined, { fixtureSchema: false });
    api = await FakeFulfilmentApi.start();
    sample = await startSample({ databaseUrl: db.url, fulfilmentUrl: api.url });
  });

  afterAll(async () => {
    await killAllSamples();
    await api?.close();
    await db?.drop();
  });

  const claimRows = async (key: string) =>
    (
      await db.pool.query(
        'SELECT scope, status, attempts FROM processed_events WHERE event_key = $1 ORDER BY scope',
        [key],
      )
    ).rows;
  const jobStates = (key: string) =>
    db.pool
      .query(`SELECT state FROM pgboss.job WHERE name = $1 AND data->'event'->>'key' = $2`, [QUEUE, key])
      .then((result) => result.rows.map((row) => row.state as string));
  const expectedCall = (id: string) => ({
    idempotencyKey: downstreamFormOf(id),
    body: { eventId: id, sessionId: `cs_${id}`, email: 'jenny.rosen@example.com' },
  });

  it.each([
    ['characters above U+00FF', 'evt_ā_注文_😀'],
    ['Latin-1 (fetch would send one byte a character, not UTF-8)', 'evt_é'],
    ['a space', 'evt 1'],
  ])(
    '/fulfilment: an id with %s is fulfilled once, under its hashed form; the redelivery is replayed',
    async (_what, id) => {
      const event = checkoutSessionCompleted(id);
      const first = await deliver(sample.url, FULFILMENT, event);
      expect({ status: first.status, effect: first.body.effect }).toEqual({
        status: 200,
        effect: 'fulfilment_sent',
      });
      const again = await deliver(sample.url, FULFILMENT, event);
      expect(again.status).toBe(200);
      expect(again.headers['idempotent-replayed']).toBe('true');

      expect(downstreamFormOf(id)).toMatch(/^sha256-[A-Za-z0-9_-]{43}$/);
      expect(api.callsFor(id)).toEqual([expectedCall(id)]);
      expect(await claimRows(id)).toEqual([{ scope: 'stripe.fulfilment', status: 'done', attempts: 1 }]);
    },
  );

  it('/fulfilment-async: an id above U+00FF is acknowledged, and its job fulfils it once under its hashed form', async () => {
    const id = 'evt_async_ā_注文_😀';
    const event = checkoutSessionCompleted(id);
    const answer = await deliver(sample.url, FULFILMENT_ASYNC, event);
    expect({ status: answer.status, effect: answer.body.effect }).toEqual({
      status: 200,
      effect: 'fulfilment_queued',
    });
    await waitUntil(
      async () => (await jobStates(id))[0] === 'completed',
      'the job to complete',
      FULFILLED_MS,
    );
    const duplicate = await deliver(sample.url, FULFILMENT_ASYNC, event);
    expect(duplicate.headers['idempotent-replayed']).toBe('true');

    expect(await jobStates(id)).toEqual(['completed']);
    expect(api.callsFor(id)).toEqual([expectedCall(id)]);
    // The worker claimed the job by its key, the event's id (the async endpoint enqueues it so).
    expect(await claimRows(id)).toEqual([
      { scope: 'stripe.fulfilment-async', status: 'done', attempts: 1 },
      { scope: 'stripe.fulfilment-worker', status: 'done', attempts: 1 },
    ]);
  });

  it.each([
    ['a newline', 'evt_line\nbreak', 'U+000A (at index 8)'],
    ['a carriage return', 'evt_\r', 'U+000D (at index 4)'],
    ['a tab', 'evt\t1', 'U+0009 (at index 3)'],
    ['a C1 control (NEL)', 'evt_ā\u0085', 'U+0085 (at index 5)'],
  ])(
    'an id with %s is refused on every endpoint with 400 naming it: no claim, no order, no job, no call',
    async (_what, id, where) => {
      for (const [path, event] of [
        [ORDERS, paymentIntentSucceeded(id)],
        [FULFILMENT, checkoutSessionCompleted(id)],
        [FULFILMENT_ASYNC, checkoutSessionCompleted(id)],
      ] as const) {
        const answer = await deliver(sample.url, path, event);
        expect({ path, status: answer.status, message: answer.body.message }).toEqual({
          path,
          status: 400,
          message: expect.stringContaining(`contains the control character ${where}`),
        });
      }
      expect({
        claims: await claimRows(id),
        orders: await db.count('SELECT count(*) FROM orders WHERE stripe_event_id = $1', [id]),
        jobs: await jobStates(id),
        calls: api.callsFor(id),
      }).toEqual({ claims: [], orders: 0, jobs: [], calls: [] });
    },
  );
});
