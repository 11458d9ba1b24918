import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { FakeFulfilmentApi } from '../support/sample-downstream.js';
import { killAllSamples, startSample, type SampleProcess } from '../support/sample-process.js';
import { checkoutSessionCompleted, deliver, SAMPLE_TEST_SECRET } from '../support/sample-stripe.js';
import { waitUntil } from '../support/wait-until.js';

const FULFILMENT_ASYNC = '/webhooks/stripe/fulfilment-async';
/** The sample's queue, and its pg-boss schema (the default). */
const QUEUE = 'stripe-fulfilment';
/** Retries come after 3-6 s, then 6-12 s: two of them, with polling, well within this. */
const RETRIED_MS = 45_000;

/**
 * The sample's async fulfilment endpoint, as Stripe and the fulfilment API see it: the built
 * sample in its own process, real Postgres and pg-boss. It acknowledges once the claim and the job
 * have committed, and its worker calls the API with `Idempotency-Key: <event.id>`, retrying a
 * failed call and calling again, with the same key, after the sample is killed mid-call.
 */
describe('Stripe sample: acknowledge fast, fulfil in a worker', () => {
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

  const jobs = (key: string) =>
    db.pool
      .query(`SELECT state FROM pgboss.job WHERE name = $1 AND data->'event'->>'key' = $2`, [QUEUE, key])
      .then((result) => result.rows.map((row) => row.state as string));
  const unfinishedJobs = () =>
    db.count(`SELECT count(*) FROM pgboss.job WHERE name = $1 AND state <> 'completed'`, [QUEUE]);
  const claimRows = async (key: string) =>
    (
      await db.pool.query(
        'SELECT scope, status, attempts FROM processed_events WHERE event_key = $1 ORDER BY scope',
        [key],
      )
    ).rows;
  const expectedCall = (id: string, email: string) => ({
    idempotencyKey: id,
    body: { eventId: id, sessionId: `cs_${id}`, email },
  });

  it('answers 200 without waiting for the fulfilment API; the worker then calls it once; duplicates are replayed with one job', async () => {
    const held = api.holdNext();
    const event = checkoutSessionCompleted('evt_async', 'ada@example.com');
    const answer = await deliver(sample.url, FULFILMENT_ASYNC, event);
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({ eventId: 'evt_async', effect: 'fulfilment_queued' });
    // Acknowledged with the job committed, whether or not the worker has reached the API yet.
    expect(await jobs('evt_async')).toHaveLength(1);
    const duplicate = await deliver(sample.url, FULFILMENT_ASYNC, event);
    expect(duplicate.status).toBe(200);
    expect(duplicate.headers['idempotent-replayed']).toBe('true');

    await held.arrived;
    held.release(200);
    await waitUntil(async () => (await jobs('evt_async'))[0] === 'completed', 'the job to complete');
    expect(await jobs('evt_async')).toEqual(['completed']);
    expect(api.callsFor('evt_async')).toEqual([expectedCall('evt_async', 'ada@example.com')]);
    expect(await claimRows('evt_async')).toEqual([
      { scope: 'stripe.fulfilment-async', status: 'done', attempts: 1 },
      { scope: 'stripe.fulfilment-worker', status: 'done', attempts: 1 },
    ]);
  });

  it('a failed call (non-2xx, then a network error) fails the job, which pg-boss retries with the same Idempotency-Key', async () => {
    api.answerNext(500);
    api.resetNext();
    const event = checkoutSessionCompleted('evt_async_retry', 'grace@example.com');
    expect((await deliver(sample.url, FULFILMENT_ASYNC, event)).status).toBe(200);
    await waitUntil(
      async () => (await jobs('evt_async_retry'))[0] === 'completed',
      'the job to complete after two retries',
      RETRIED_MS,
    );
    const calls = api.callsFor('evt_async_retry');
    expect(calls).toEqual(Array(3).fill(expectedCall('evt_async_retry', 'grace@example.com')));
    expect(await claimRows('evt_async_retry')).toEqual([
      { scope: 'stripe.fulfilment-async', status: 'done', attempts: 1 },
      { scope: 'stripe.fulfilment-worker', status: 'done', attempts: 3 },
    ]);
    await sample.waitForLog(['evt_async_retry', 'failed on attempt 1', 'Fulfilment API answered 500']);
  });

  it('npm run sample:send -- fulfilment-async: processed once, replayed once', async () => {
    const port = new URL(sample.url).port;
    const { stdout } = await promisify(execFile)(
      process.execPath,
      ['dist/sample/send-test-event.js', 'fulfilment-async'],
      {
        env: { ...process.env, NODE_OPTIONS: '', PORT: port, STRIPE_WEBHOOK_SECRET: SAMPLE_TEST_SECRET },
        timeout: 30_000,
      },
    );
    expect(stdout).toContain('/webhooks/stripe/fulfilment-async, twice');
    expect(stdout).toContain('Processed once, replayed once.');
    expect(stdout).toContain('a worker fulfils it now');
    // And it does: one call for the demo's event, and no job left for the next test's sample.
    const eventId = /Sending \S+ (\S+) to/.exec(stdout)?.[1];
    expect(eventId).toMatch(/^evt_/);
    await waitUntil(
      async () => (await jobs(eventId!))[0] === 'completed',
      "the demo event's job to complete",
    );
    expect(api.callsFor(eventId!)).toHaveLength(1);
  });

  it('killed mid-call: after a restart the job is handed out again once the lease has passed, with the same Idempotency-Key', async () => {
    // A short lease (and with it the job's expiry), in a sample of its own.
    await killAllSamples();
    const leaseMs = 3_000;
    // The call held below must be this event's: no earlier job may still be waiting for a worker.
    expect(await unfinishedJobs()).toBe(0);
    const first = await startSample({ databaseUrl: db.url, fulfilmentUrl: api.url, leaseMs });
    const held = api.holdNext();
    const event = checkoutSessionCompleted('evt_async_kill', 'alan@example.com');
    expect((await deliver(first.url, FULFILMENT_ASYNC, event)).status).toBe(200);
    await held.arrived;
    await first.kill();
    expect(await jobs('evt_async_kill')).toEqual(['active']);

    await startSample({ databaseUrl: db.url, fulfilmentUrl: api.url, leaseMs });
    // Once the lease (and the job's expiry) has passed, the sample's 5 s maintenance hands it out
    // again. Bounded generously: how soon is the bench's business, not a test's.
    await waitUntil(
      async () => (await jobs('evt_async_kill'))[0] === 'completed',
      'the job to complete',
      60_000,
    );
    expect(api.callsFor('evt_async_kill')).toEqual(
      Array(2).fill(expectedCall('evt_async_kill', 'alan@example.com')),
    );
    expect(await claimRows('evt_async_kill')).toEqual([
      { scope: 'stripe.fulfilment-async', status: 'done', attempts: 1 },
      { scope: 'stripe.fulfilment-worker', status: 'done', attempts: 2 },
    ]);
  });
});
