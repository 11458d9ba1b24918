import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { DataSource } from 'typeorm';
import {
  crashBeforeCommit,
  expectCrashRecovery,
  expectOneEffect,
  expireLease,
} from '../../lib/testing/index.js';
import { AppModule } from '../../sample/app.module.js';
import { loadSampleConfig } from '../../sample/config/sample-config.js';
import { STRIPE_SCOPES } from '../../sample/stripe/stripe-scopes.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { FakeFulfilmentApi } from '../support/sample-downstream.js';
import {
  checkoutSessionCompleted,
  deliver,
  FULFILMENT,
  FULFILMENT_ASYNC,
  invoicePaid,
  ORDERS,
  paymentIntentSucceeded,
  SAMPLE_TEST_SECRET,
} from '../support/sample-stripe.js';
import { waitUntil } from '../support/wait-until.js';

/** The sample's pg-boss queue (sample/stripe/stripe-scopes.ts). */
const QUEUE = 'stripe-fulfilment';
/** A failed job is retried after 3-6 s (sample/app.module.ts); polling adds a second. */
const RETRIED_MS = 20_000;

/**
 * The seed's two tests, on the sample's own handlers, written as a user of the library writes
 * them for theirs: the sample's AppModule booted in this process (real Postgres, pg-boss, the
 * Stripe signature guard with the sample's test secret), each endpoint driven through
 * `nest-idempotent-webhooks/testing`. Every event is delivered signed anew, as Stripe would.
 */
describe.each(onAdapter('fastify'))("the Stripe sample's handlers, exactly once (%s)", (adapter) => {
  let db: TestDatabase;
  let api: FakeFulfilmentApi;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase(undefined, { fixtureSchema: false });
    api = await FakeFulfilmentApi.start();
    const config = loadSampleConfig({
      STRIPE_WEBHOOK_SECRET: SAMPLE_TEST_SECRET,
      FULFILMENT_URL: api.url,
      // Longer than the test: a crashed worker's lease ends only through expireLease().
      IDEMPOTENCY_LEASE_MS: '600000',
    });
    // As sample/main.ts starts it: the guard verifies Stripe's signature over the raw bytes.
    running = await startApp(adapter, [AppModule.forRoot(config, db.url)], { rawBody: true });
  });

  afterAll(async () => {
    await running?.close();
    await api?.close();
    await db?.drop();
  });

  const id = (name: string) => `evt_${name}_${adapter}`;
  const send = (path: string, event: unknown) => () => deliver(running.url, path, event);
  const dataSource = () => running.app.get(DataSource);
  const orders = (eventId: string) =>
    db.count('SELECT count(*) FROM orders WHERE stripe_event_id = $1', [eventId]);
  const paidInvoices = (invoiceId: string) =>
    db.count(`SELECT count(*) FROM invoices WHERE id = $1 AND status = 'paid'`, [invoiceId]);
  /** Fulfilment jobs queued for the event (by the async endpoint, in its claim's transaction). */
  const jobs = (eventId: string) =>
    db.count(`SELECT count(*) FROM pgboss.job WHERE name = $1 AND data->'event'->>'key' = $2`, [
      QUEUE,
      eventId,
    ]);
  const jobStates = async (eventId: string) =>
    (
      await db.pool.query(`SELECT state FROM pgboss.job WHERE name = $1 AND data->'event'->>'key' = $2`, [
        QUEUE,
        eventId,
      ])
    ).rows.map((row) => row.state as string);
  /** What a fulfilment API that dedupes by Idempotency-Key applies: one fulfilment per distinct key. */
  const fulfilled = (eventId: string) =>
    new Set(api.callsFor(eventId).map((call) => call.idempotencyKey)).size;
  const claim = async (scope: string, key: string) =>
    (
      await db.pool.query(
        'SELECT status, attempts FROM processed_events WHERE scope = $1 AND event_key = $2',
        [scope, key],
      )
    ).rows[0];

  describe('orders (transaction mode)', () => {
    it('payment_intent.succeeded: one order, delivered twice and five times at once', async () => {
      const key = id('order_once');
      const event = paymentIntentSucceeded(key);
      await expectOneEffect({ deliver: send(ORDERS, event), effect: () => orders(key) });
    });

    it('payment_intent.succeeded: a crash before the COMMIT leaves no order, the redelivery exactly one', async () => {
      const key = id('order_crash');
      const event = paymentIntentSucceeded(key);
      await expectCrashRecovery({
        deliver: send(ORDERS, event),
        effect: () => orders(key),
        scope: STRIPE_SCOPES.orders,
        key: key,
      });
      expect(await claim(STRIPE_SCOPES.orders, key)).toEqual({ status: 'done', attempts: 1 });
    });

    it('invoice.paid: a crash before the COMMIT leaves the invoice pending, the redelivery pays it once', async () => {
      const invoice = `in_crash_${adapter}`;
      await db.pool.query(
        `INSERT INTO invoices (id, status, amount_due, currency) VALUES ($1, 'pending', 5000, 'usd')`,
        [invoice],
      );
      const key = id('invoice_crash');
      const event = invoicePaid(key, invoice);
      await expectCrashRecovery({
        deliver: send(ORDERS, event),
        effect: () => paidInvoices(invoice),
        scope: STRIPE_SCOPES.orders,
        key: key,
      });
    });
  });

  describe('fulfilment (external mode: a call to the fulfilment API)', () => {
    it('checkout.session.completed: one call to the API, delivered twice and five times at once', async () => {
      const key = id('fulfil_once');
      const event = checkoutSessionCompleted(key);
      // Calls, not keys: without a crash, the lease lets exactly one delivery call the API.
      await expectOneEffect({
        deliver: send(FULFILMENT, event),
        effect: () => api.callsFor(key).length,
      });
      expect(api.callsFor(key)).toEqual([
        {
          idempotencyKey: key,
          body: { eventId: key, sessionId: `cs_${key}`, email: 'jenny.rosen@example.com' },
        },
      ]);
    });

    it('checkout.session.completed: a crash after the call, before its completion: called again with the same Idempotency-Key, fulfilled once', async () => {
      const key = id('fulfil_crash');
      const event = checkoutSessionCompleted(key);
      await expectCrashRecovery({
        deliver: send(FULFILMENT, event),
        effect: () => fulfilled(key),
        external: true,
        dataSource: dataSource(),
        scope: STRIPE_SCOPES.fulfilment,
        key: key,
      });
      // The work ran twice, as at-least-once means for an API call; the key made it one fulfilment.
      expect(api.callsFor(key).map((call) => call.idempotencyKey)).toEqual([key, key]);
      expect(await claim(STRIPE_SCOPES.fulfilment, key)).toEqual({ status: 'done', attempts: 2 });
    });
  });

  describe('fulfilment-async (transaction mode: the handoff to a worker)', () => {
    it('checkout.session.completed: one job, delivered twice and five times at once; the worker calls the API once', async () => {
      const key = id('async_once');
      const event = checkoutSessionCompleted(key);
      await expectOneEffect({ deliver: send(FULFILMENT_ASYNC, event), effect: () => jobs(key) });
      await waitUntil(async () => (await jobStates(key))[0] === 'completed', 'the job to complete');
      expect(api.callsFor(key)).toHaveLength(1);
    });

    it('checkout.session.completed: a crash before the COMMIT queues no job, the redelivery exactly one', async () => {
      const key = id('async_crash');
      const event = checkoutSessionCompleted(key);
      await expectCrashRecovery({
        deliver: send(FULFILMENT_ASYNC, event),
        effect: () => jobs(key),
        scope: STRIPE_SCOPES.fulfilmentAsync,
        key: key,
      });
      await waitUntil(async () => (await jobStates(key))[0] === 'completed', 'the job to complete');
      expect(api.callsFor(key)).toHaveLength(1);
    });

    it('the worker crashed after its call: pg-boss retries the job once the lease is ended, the API sees the same key', async () => {
      const key = id('worker_crash');
      const event = checkoutSessionCompleted(key);
      // The worker is not called by the test, so crashBeforeCommit and expireLease are used by hand.
      const disarm = crashBeforeCommit({ scope: STRIPE_SCOPES.fulfilmentWorker, key: key });
      try {
        expect((await send(FULFILMENT_ASYNC, event)()).status).toBe(200);
        await waitUntil(async () => (await jobStates(key))[0] === 'retry', 'the crashed job to fail');
      } finally {
        disarm();
      }
      expect(api.callsFor(key)).toHaveLength(1);
      expect(await claim(STRIPE_SCOPES.fulfilmentWorker, key)).toEqual({
        status: 'in_progress',
        attempts: 1,
      });
      expect(await expireLease(dataSource(), STRIPE_SCOPES.fulfilmentWorker, key)).toBe(true);
      await waitUntil(
        async () => (await jobStates(key))[0] === 'completed',
        'the retried job to complete',
        RETRIED_MS,
      );
      expect(api.callsFor(key).map((call) => call.idempotencyKey)).toEqual([key, key]);
      expect(fulfilled(key)).toBe(1);
      expect(await claim(STRIPE_SCOPES.fulfilmentWorker, key)).toEqual({ status: 'done', attempts: 2 });
    });
  });
});
