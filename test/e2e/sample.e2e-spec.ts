import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { MIGRATION_LOCK_ID } from '../../sample/database/run-migrations.js';
import {
  ACTS_ON,
  deepArray,
  MALFORMED_EVENTS,
  refusalPrefix,
  refusedBy,
} from '../fixtures/bad-input-sample.fixture.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { pgBouncerPerFile, routeUrl, ROUTES } from '../support/database-routes.js';
import { startPgBouncer, type PgBouncer } from '../support/pgbouncer.js';
import { startPostgres, type PostgresServer } from '../support/postgres-server.js';
import { FakeFulfilmentApi } from '../support/sample-downstream.js';
import {
  healthStatus,
  killAllSamples,
  SAMPLE_READY_MS,
  startSample,
  type SampleProcess,
} from '../support/sample-process.js';
import {
  checkoutSessionCompleted,
  deliver,
  FULFILMENT,
  FULFILMENT_ASYNC,
  invoicePaid,
  ORDERS,
  payloadOf,
  paymentIntentSucceeded,
  signatureFor,
  stripeEvent,
  type DeliveryOptions,
} from '../support/sample-stripe.js';
import { waitUntil } from '../support/wait-until.js';

/** PgBouncer's query_wait_timeout in front of the server the outage test stops. */
const QUERY_WAIT_SECONDS = 2;

/** PgBouncer in transaction mode in front of the run's PostgreSQL, for the `pgbouncer` route. */
const pooler = pgBouncerPerFile();

/**
 * The Stripe sample as Stripe sees it: the built app in its own process (`node
 * dist/sample/main.js`), real Postgres, correctly signed deliveries over HTTP. One test per row of
 * the issue's answers table, each asserting what was written, not only the status. Directly, and
 * with DATABASE_URL through PgBouncer in transaction mode, the sample's settings otherwise as they
 * are: its pool of 10 connections takes turns on PgBouncer's few server connections.
 */
describe.each(ROUTES)('Stripe sample: answers (%s)', (route) => {
  let db: TestDatabase;
  let api: FakeFulfilmentApi;
  let sample: SampleProcess;

  beforeAll(async () => {
    // The sample's own migration creates `orders`; the fixture tables would be in its way.
    db = await createTestDatabase(undefined, { fixtureSchema: false });
    api = await FakeFulfilmentApi.start();
    sample = await startSample({ databaseUrl: routeUrl(route, db, pooler), fulfilmentUrl: api.url });
  });

  afterAll(async () => {
    await killAllSamples();
    await api?.close();
    await db?.drop();
  });

  const orders = (eventId: string) =>
    db.count('SELECT count(*) FROM orders WHERE stripe_event_id = $1', [eventId]);
  const claims = (key: string) =>
    db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [key]);
  /** Everything a delivery can write: claims of the sample's scopes, orders, fulfilment calls. */
  const footprint = async () => ({
    claims: await db.count(`SELECT count(*) FROM processed_events WHERE scope LIKE 'stripe.%'`),
    orders: await db.count('SELECT count(*) FROM orders'),
    fulfilmentCalls: api.calls.length,
  });
  const claimRows = async (key: string) =>
    (
      await db.pool.query(
        'SELECT scope, status, attempts FROM processed_events WHERE event_key = $1 ORDER BY scope',
        [key],
      )
    ).rows;

  it('processed now: 200 and one order with the payment intent, amount and currency', async () => {
    const answer = await deliver(sample.url, ORDERS, paymentIntentSucceeded('evt_new'));
    expect(answer.status).toBe(200);
    expect(answer.headers['idempotent-replayed']).toBeUndefined();
    expect(answer.body).toEqual({
      received: true,
      eventId: 'evt_new',
      type: 'payment_intent.succeeded',
      effect: 'order_created',
    });
    const { rows } = await db.pool.query(
      'SELECT payment_intent_id, amount, currency FROM orders WHERE stripe_event_id = $1',
      ['evt_new'],
    );
    expect(rows).toEqual([{ payment_intent_id: 'pi_evt_new', amount: 4200, currency: 'eur' }]);
    expect(await claimRows('evt_new')).toEqual([{ scope: 'stripe.orders', status: 'done', attempts: 1 }]);
  });

  it('already done: 200 + Idempotent-Replayed: true, and the handler does not run again', async () => {
    const event = paymentIntentSucceeded('evt_twice');
    expect((await deliver(sample.url, ORDERS, event)).status).toBe(200);
    for (let redelivery = 0; redelivery < 3; redelivery++) {
      const answer = await deliver(sample.url, ORDERS, event);
      expect(answer.status).toBe(200);
      expect(answer.headers['idempotent-replayed']).toBe('true');
    }
    expect(await orders('evt_twice')).toBe(1);
    expect(await claims('evt_twice')).toBe(1);
    const log = sample
      .output()
      .split('\n')
      .filter((line) => line.includes('evt_twice: order'));
    expect(log).toHaveLength(1);
  });

  it('the order insert is idempotent on its own: with the claim lost, a redelivery still makes no second order', async () => {
    const event = paymentIntentSucceeded('evt_claim_lost');
    expect((await deliver(sample.url, ORDERS, event)).body.effect).toBe('order_created');
    // The seed's "dedupe tables fail": someone empties the claim.
    await db.pool.query('DELETE FROM processed_events WHERE event_key = $1', ['evt_claim_lost']);

    const again = await deliver(sample.url, ORDERS, event);
    expect(again.status).toBe(200);
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    expect(again.body.effect).toBe('order_exists');
    expect(await orders('evt_claim_lost')).toBe(1);
    expect(await claims('evt_claim_lost')).toBe(1);
  });

  it('in flight elsewhere: 409 + Retry-After while another delivery holds the fulfilment lease', async () => {
    const event = checkoutSessionCompleted('evt_in_flight');
    const held = api.holdNext();
    const first = deliver(sample.url, FULFILMENT, event).then((answer) => answer);
    await held.arrived;

    const duplicate = await deliver(sample.url, FULFILMENT, event);
    expect(duplicate.status).toBe(409);
    const retryAfter = Number(duplicate.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(30);
    expect(await claimRows('evt_in_flight')).toEqual([
      { scope: 'stripe.fulfilment', status: 'in_progress', attempts: 1 },
    ]);

    held.release(200);
    expect((await first).status).toBe(200);
    expect(api.callsFor('evt_in_flight')).toHaveLength(1);
    expect(await claimRows('evt_in_flight')).toEqual([
      { scope: 'stripe.fulfilment', status: 'done', attempts: 1 },
    ]);
  });

  const stale = Math.floor(Date.now() / 1000) - 600;
  const tampered = paymentIntentSucceeded('evt_bad_tampered', { amount_received: 1 });
  /**
   * [case, body, how it is signed, status, why the sample refuses it]. The library's
   * StripeSignatureGuard answers a missing or malformed header 400 and a signature that does not
   * verify (another secret, other bytes, too old) 401.
   */
  const badDeliveries: [string, unknown, DeliveryOptions, 400 | 401, RegExp][] = [
    [
      'missing Stripe-Signature',
      paymentIntentSucceeded('evt_bad_unsigned'),
      { signature: null },
      400,
      /^Stripe-Signature header is missing$/,
    ],
    [
      'malformed Stripe-Signature',
      paymentIntentSucceeded('evt_bad_malformed'),
      { signature: 'not-a-stripe-signature' },
      400,
      /^Stripe-Signature header is malformed/,
    ],
    [
      'signed with another secret',
      paymentIntentSucceeded('evt_bad_secret'),
      { secret: 'whsec_other' },
      401,
      /^Stripe-Signature does not match the raw request body.*No signatures found/,
    ],
    [
      'signature of other bytes',
      tampered,
      { signature: signatureFor(payloadOf(paymentIntentSucceeded('evt_bad_tampered'))) },
      401,
      /^Stripe-Signature does not match the raw request body.*No signatures found/,
    ],
    [
      'stale signature (10 minutes old)',
      paymentIntentSucceeded('evt_bad_stale'),
      { timestamp: stale },
      401,
      /^Stripe-Signature is \d+ s old, more than the tolerance of 300 s/,
    ],
    [
      'signature dated an hour in the future',
      paymentIntentSucceeded('evt_bad_future'),
      { timestamp: Math.floor(Date.now() / 1000) + 3_600 },
      401,
      /^Stripe-Signature is \d+ s in the future, more than the tolerance of 300 s: check the server's clock$/,
    ],
    [
      'correctly signed empty body',
      '',
      {},
      400,
      /^Stripe-Signature is valid, but the signed body is empty; a delivery carries its event as JSON$/,
    ],
    [
      'correctly signed form body',
      'id=evt_bad_form&type=payment_intent.succeeded',
      { contentType: 'application/x-www-form-urlencoded' },
      400,
      /^Stripe-Signature is valid, but the signed body is not JSON \(Unexpected token 'i', .*\); a delivery carries its event as UTF-8 JSON$/,
    ],
    [
      'correctly signed UTF-16 body',
      // UTF-16LE of ASCII without a byte order mark is valid UTF-8, NULs and all: the SDK verifies it.
      Buffer.from(JSON.stringify(paymentIntentSucceeded('evt_bad_utf16')), 'utf16le').toString('utf8'),
      { contentType: 'application/json; charset=utf-16le' },
      400,
      /^Stripe-Signature is valid, but the signed body is not JSON \(.*\); a delivery carries its event as UTF-8 JSON$/,
    ],
    ['body not JSON', '{"id": "evt_bad_json", ', {}, 400, /JSON/],
    [
      'body not JSON (text/plain)',
      'evt_bad_text',
      { contentType: 'text/plain' },
      400,
      /^Cannot verify Stripe-Signature: the request has no raw body to check \(Content-Type text\/plain\)/,
    ],
    [
      'no id',
      stripeEvent(undefined, 'payment_intent.succeeded', {}),
      {},
      400,
      /must be a string, got undefined/,
    ],
    [
      'id not a string',
      stripeEvent(12345, 'payment_intent.succeeded', {}),
      {},
      400,
      /must be a string, got number/,
    ],
    [
      'key longer than 255 characters',
      paymentIntentSucceeded(`evt_${'x'.repeat(300)}`),
      {},
      400,
      /maximum is 255/,
    ],
  ];

  it.each(badDeliveries)(
    '%s: refused on every endpoint, nothing written',
    async (_case, body, options, status, why) => {
      const before = await footprint();
      for (const path of [ORDERS, FULFILMENT, FULFILMENT_ASYNC]) {
        const answer = await deliver(sample.url, path, body, options);
        expect({ path, status: answer.status }).toEqual({ path, status });
        expect(answer.body.message).toMatch(why);
      }
      expect(await footprint()).toEqual(before);
    },
  );

  it('handler failed (orders): 500, the claim rolls back with the order, so a redelivery runs again', async () => {
    // A valid event whose insert the database refuses inside the claim's transaction (here a
    // constraint the event's schema knows nothing of, as a trigger or a foreign key would be).
    const event = paymentIntentSucceeded('evt_orders_fail');
    await db.pool.query(
      `ALTER TABLE orders ADD CONSTRAINT refuse_evt_orders_fail CHECK (payment_intent_id <> 'pi_evt_orders_fail')`,
    );
    try {
      for (let delivery = 0; delivery < 2; delivery++) {
        const answer = await deliver(sample.url, ORDERS, event);
        // Never 200-replayed: nothing was marked done.
        expect(answer.status).toBe(500);
        expect(answer.headers['idempotent-replayed']).toBeUndefined();
        // The order and the claim rolled back; the failure is recorded outside the transaction.
        expect(await claimRows('evt_orders_fail')).toEqual([
          { scope: 'stripe.orders', status: 'failed', attempts: delivery + 1 },
        ]);
        expect(await orders('evt_orders_fail')).toBe(0);
      }
    } finally {
      await db.pool.query('ALTER TABLE orders DROP CONSTRAINT refuse_evt_orders_fail');
    }
  });

  /** The fulfilment jobs queued for event `id` by the async endpoint. */
  const jobs = (id: string) =>
    db.count(
      `SELECT count(*) FROM pgboss.job WHERE name = 'stripe-fulfilment' AND data->'event'->>'key' = $1`,
      [id],
    );

  let malformed = 0;
  it.each(MALFORMED_EVENTS.map((event) => [event.name, event] as const))(
    'malformed event (%s): 400 naming the field on the endpoints that act on its type, no claim row, nothing written; 200 ignored on the others',
    async (_name, event) => {
      /** The claim rows each refusal left, checked last: every other check runs whatever they are. */
      const refusedClaims: { path: string; rows: unknown[] }[] = [];
      for (const path of Object.keys(ACTS_ON)) {
        const id = `evt_malformed_${++malformed}`;
        const answer = await deliver(sample.url, path, event.payload(id));
        const rows = await claimRows(id);
        if (refusedBy(event, path)) {
          expect({ path, status: answer.status }).toEqual({ path, status: 400 });
          expect(String(answer.body.message).startsWith(refusalPrefix(event))).toBe(true);
          expect(answer.body.issues[0].path).toBe(event.path);
          refusedClaims.push({ path, rows });
        } else {
          expect({ path, status: answer.status, effect: answer.body.effect }).toEqual({
            path,
            status: 200,
            effect: 'ignored',
          });
          expect(rows).toHaveLength(1);
        }
        expect({
          path,
          orders: await orders(id),
          calls: api.callsFor(id).length,
          jobs: await jobs(id),
        }).toEqual({ path, orders: 0, calls: 0, jobs: 0 });
      }
      // In transaction mode the refusal rolls the claim back; in external mode the library
      // removes the claim of a handler that answered 4xx, so neither leaves a row.
      expect(refusedClaims).toEqual(refusedClaims.map(({ path }) => ({ path, rows: [] })));
    },
  );

  it('a 40,000-deep field the sample does not read is no obstacle: the order is made once', async () => {
    const payload = JSON.stringify(
      paymentIntentSucceeded('evt_deep_metadata', { metadata: '__DEEP__' }),
    ).replace('"__DEEP__"', deepArray());
    const answer = await deliver(sample.url, ORDERS, payload);
    expect({ status: answer.status, effect: answer.body.effect }).toEqual({
      status: 200,
      effect: 'order_created',
    });
    expect(await orders('evt_deep_metadata')).toBe(1);
    expect(await claimRows('evt_deep_metadata')).toEqual([
      { scope: 'stripe.orders', status: 'done', attempts: 1 },
    ]);
  });

  it('a corrected redelivery of a refused event is processed, once', async () => {
    const refused = await deliver(
      sample.url,
      ORDERS,
      JSON.stringify(paymentIntentSucceeded('evt_corrected', { amount_received: 'abc' })),
    );
    expect(refused.status).toBe(400);
    const corrected = await deliver(sample.url, ORDERS, paymentIntentSucceeded('evt_corrected'));
    expect({ status: corrected.status, effect: corrected.body.effect }).toEqual({
      status: 200,
      effect: 'order_created',
    });
    expect(await orders('evt_corrected')).toBe(1);
    expect(await claimRows('evt_corrected')).toEqual([
      { scope: 'stripe.orders', status: 'done', attempts: 1 },
    ]);
  });

  it('handler failed (fulfilment API non-2xx, then network error): 502, lease released, retried with the same Idempotency-Key', async () => {
    const event = checkoutSessionCompleted('evt_api_fail', 'ada@example.com');
    api.answerNext(500);
    const refused = await deliver(sample.url, FULFILMENT, event);
    expect(refused.status).toBe(502);
    expect(await claimRows('evt_api_fail')).toEqual([
      { scope: 'stripe.fulfilment', status: 'failed', attempts: 1 },
    ]);

    api.resetNext();
    const unreachable = await deliver(sample.url, FULFILMENT, event);
    expect(unreachable.status).toBe(502);
    expect(await claimRows('evt_api_fail')).toEqual([
      { scope: 'stripe.fulfilment', status: 'failed', attempts: 2 },
    ]);

    const succeeded = await deliver(sample.url, FULFILMENT, event);
    expect(succeeded.status).toBe(200);
    expect(succeeded.headers['idempotent-replayed']).toBeUndefined();
    expect((await deliver(sample.url, FULFILMENT, event)).headers['idempotent-replayed']).toBe('true');

    const calls = api.callsFor('evt_api_fail');
    expect(calls).toHaveLength(3);
    for (const call of calls) {
      expect(call).toEqual({
        idempotencyKey: 'evt_api_fail',
        body: { eventId: 'evt_api_fail', sessionId: 'cs_evt_api_fail', email: 'ada@example.com' },
      });
    }
    expect(await claimRows('evt_api_fail')).toEqual([
      { scope: 'stripe.fulfilment', status: 'done', attempts: 3 },
    ]);
  });

  it('invoice.paid: the conditional update pays a pending invoice once and leaves a paid one alone', async () => {
    await db.pool.query(
      `INSERT INTO invoices (id, status, amount_due, currency) VALUES ('in_sample', 'pending', 5000, 'usd')`,
    );
    const paid = await deliver(sample.url, ORDERS, invoicePaid('evt_invoice_paid', 'in_sample'));
    expect(paid.body.effect).toBe('invoice_paid');
    const [first] = (await db.pool.query(`SELECT status, paid_at FROM invoices WHERE id = 'in_sample'`)).rows;
    expect(first.status).toBe('paid');
    expect(first.paid_at).toBeInstanceOf(Date);

    const replay = await deliver(sample.url, ORDERS, invoicePaid('evt_invoice_paid', 'in_sample'));
    expect(replay.headers['idempotent-replayed']).toBe('true');
    // A different event for the same invoice is processed, and changes nothing.
    const late = await deliver(sample.url, ORDERS, invoicePaid('evt_invoice_paid_late', 'in_sample'));
    expect(late.status).toBe(200);
    expect(late.body.effect).toBe('invoice_unchanged');
    const [after] = (await db.pool.query(`SELECT status, paid_at FROM invoices WHERE id = 'in_sample'`)).rows;
    expect(after).toEqual(first);
  });

  it('other event types are claimed and answered 200 with no effect', async () => {
    const event = stripeEvent('evt_customer', 'customer.created', { id: 'cus_1', object: 'customer' });
    const before = await footprint();
    const answer = await deliver(sample.url, ORDERS, event);
    expect(answer.status).toBe(200);
    expect(answer.body.effect).toBe('ignored');
    expect((await deliver(sample.url, ORDERS, event)).headers['idempotent-replayed']).toBe('true');
    expect(await footprint()).toEqual({ ...before, claims: before.claims + 1 });
  });

  it('the same event sent to both endpoints is processed once by each', async () => {
    const event = checkoutSessionCompleted('evt_both');
    const first = await Promise.all([
      deliver(sample.url, ORDERS, event),
      deliver(sample.url, FULFILMENT, event),
    ]);
    expect(first.map((answer) => [answer.status, answer.body.effect])).toEqual([
      [200, 'ignored'],
      [200, 'fulfilment_sent'],
    ]);
    for (const path of [ORDERS, FULFILMENT]) {
      expect((await deliver(sample.url, path, event)).headers['idempotent-replayed']).toBe('true');
    }
    expect(await claimRows('evt_both')).toEqual([
      { scope: 'stripe.fulfilment', status: 'done', attempts: 1 },
      { scope: 'stripe.orders', status: 'done', attempts: 1 },
    ]);
    expect(api.callsFor('evt_both')).toHaveLength(1);

    const payment = paymentIntentSucceeded('evt_both_payment');
    expect((await deliver(sample.url, FULFILMENT, payment)).body.effect).toBe('ignored');
    expect((await deliver(sample.url, ORDERS, payment)).body.effect).toBe('order_created');
    expect(await orders('evt_both_payment')).toBe(1);
    expect(await claims('evt_both_payment')).toBe(2);
  });

  it('GET /health answers 200 and GET /metrics counts claims by scope and outcome', async () => {
    const health = await fetch(`${sample.url}/health`);
    expect(health.status).toBe(200);
    expect(await health.json()).toMatchObject({
      status: 'ok',
      info: {
        database: { status: 'up' },
        // The library's indicator: the claims table answered, and the fulfilment queue is there.
        idempotency: {
          status: 'up',
          claimsTable: 'reachable',
          queues: { 'stripe-fulfilment': { deadLettered: 0 } },
        },
      },
    });

    const counted = async (outcome: string) => {
      const text = await (await fetch(`${sample.url}/metrics`)).text();
      expect(text).toMatch(/^idempotency_expired_leases \d+$/m);
      const line = new RegExp(
        `^idempotency_claims_total\\{scope="stripe.orders",outcome="${outcome}"\\} (\\d+)$`,
        'm',
      );
      return Number(text.match(line)?.[1] ?? 0);
    };
    const before = { claimed: await counted('claimed'), replayed: await counted('replayed') };
    const event = paymentIntentSucceeded('evt_metrics');
    await deliver(sample.url, ORDERS, event);
    await deliver(sample.url, ORDERS, event);
    expect({ claimed: await counted('claimed'), replayed: await counted('replayed') }).toEqual({
      claimed: before.claimed + 1,
      replayed: before.replayed + 1,
    });
  });
});

describe.each(ROUTES)('Stripe sample: database unreachable (%s)', (route) => {
  let server: PostgresServer;
  let serverPooler: PgBouncer | undefined;
  let db: TestDatabase;
  let api: FakeFulfilmentApi;
  let sample: SampleProcess;

  beforeAll(async () => {
    // A server of its own, since this test stops it; behind a pooler of its own, which stays up.
    server = await startPostgres({ reuseDatabaseUrl: false });
    db = await createTestDatabase(server.adminUrl, { fixtureSchema: false });
    // While Postgres is down, PgBouncer holds a query waiting for a server connection for
    // query_wait_timeout before failing it (08P01), then fails the next ones at once for
    // server_login_retry: kept short, as a webhook app's pooler should (see sample/README.md).
    if (route === 'pgbouncer')
      serverPooler = await startPgBouncer(server.adminUrl, { queryWaitTimeoutSeconds: QUERY_WAIT_SECONDS });
    api = await FakeFulfilmentApi.start();
    sample = await startSample({
      databaseUrl: serverPooler ? serverPooler.urlFor(db.url) : db.url,
      fulfilmentUrl: api.url,
    });
  }, 120_000);

  afterAll(async () => {
    await killAllSamples();
    await serverPooler?.stop();
    await api?.close();
    // The database went with its server: only the test's pool is left to close.
    await db?.pool.end();
    await server?.stop();
  });

  it('answers 503 + Retry-After (never 200, no handler runs) and GET /health answers 503', async () => {
    const before = paymentIntentSucceeded('evt_before_outage');
    expect((await deliver(sample.url, ORDERS, before)).status).toBe(200);
    expect(await db.count('SELECT count(*) FROM orders')).toBe(1);

    await server.stop();

    const deliveries = [
      [ORDERS, paymentIntentSucceeded('evt_during_outage')],
      // Done before the outage, yet "done" cannot be checked now: 503, not a replay.
      [ORDERS, before],
      [FULFILMENT, checkoutSessionCompleted('evt_fulfil_during_outage')],
    ] as const;
    for (const [path, event] of deliveries) {
      const answer = await deliver(sample.url, path, event);
      expect({ path, id: event.id, status: answer.status }).toEqual({ path, id: event.id, status: 503 });
      expect(answer.headers['retry-after']).toBe('30');
    }
    expect(api.calls).toHaveLength(0);
    expect(await healthStatus(sample.url)).toBe(503);
  });
});

/**
 * Replicas that start together migrate one at a time, through a pooler in transaction mode too.
 * This PgBouncer hands out its server connections in turn, so one client's consecutive
 * statements run on different server sessions, as they may on a busy pooler: a session advisory
 * lock taken by one statement and released by a later one would stay with the first session,
 * and the next replica would wait for it forever.
 */
describe('Stripe sample: replicas migrating at once through PgBouncer', () => {
  /** The test starts three samples, each allowed SAMPLE_READY_MS, and then some. */
  const THREE_STARTS_MS = 4 * SAMPLE_READY_MS;
  const roundRobin = pgBouncerPerFile({ serverRoundRobin: true });
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase(undefined, { fixtureSchema: false });
  });

  afterAll(async () => {
    await killAllSamples();
    await db?.drop();
  });

  /** Advisory locks on the sample's migration lock, held or waited for, in the test database. */
  const migrationLocks = (granted: boolean) =>
    db.count(
      `SELECT count(*) FROM pg_locks
       WHERE locktype = 'advisory' AND granted = $3 AND objid = $2 AND objsubid = 1
         AND database = (SELECT oid FROM pg_database WHERE datname = $1)`,
      [db.name, MIGRATION_LOCK_ID, granted],
    );

  it(
    'the second waits for the first, each migration runs once, and no lock is left behind',
    async () => {
      const url = roundRobin().urlFor(db.url);
      // As if another replica were migrating: the lock is taken, on a session of the test's own.
      const holder = await db.pool.connect();
      await holder.query('BEGIN');
      await holder.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK_ID]);
      const starting = [startSample({ databaseUrl: url }), startSample({ databaseUrl: url })];
      // Not awaited yet: neither can be ready before the lock is let go.
      for (const start of starting) start.catch(() => undefined);
      try {
        // Within the time a replica has to be ready at all: on a busy machine booting takes a while.
        await waitUntil(
          async () => (await migrationLocks(false)) === 2,
          'both replicas to wait for the lock',
          SAMPLE_READY_MS,
        );
      } finally {
        await holder.query('COMMIT');
        holder.release();
      }
      const replicas = await Promise.all(starting);

      const { rows } = await db.pool.query<{ name: string; runs: number }>(
        'SELECT name, count(*)::int AS runs FROM migrations GROUP BY name ORDER BY name',
      );
      expect(rows).toEqual([
        { name: 'AddFailedClaimsIndex1765238400000', runs: 1 },
        { name: 'AddStoredResponses1765584000000', runs: 1 },
        { name: 'AddUnfinishedClaimsIndex1764892800000', runs: 1 },
        { name: 'CreateEventVersions1765670400000', runs: 1 },
        { name: 'CreateOrdersAndInvoices1764633600000', runs: 1 },
        { name: 'CreateProcessedEvents1764547200000', runs: 1 },
        { name: 'CreateRefunds1765584000001', runs: 1 },
        { name: 'CreateSubscriptions1765756800000', runs: 1 },
      ]);
      const said = replicas.map((replica) =>
        replica.output().includes('Applied CreateOrdersAndInvoices1764633600000') ? 'applied' : 'up to date',
      );
      expect(said.sort()).toEqual(['applied', 'up to date']);
      expect(replicas.map((replica) => replica.output().includes('Schema up to date'))).toContain(true);
      expect(await migrationLocks(true)).toBe(0);

      // A restart finds the lock free: it starts and finds nothing to do.
      await replicas[0].terminate();
      const restarted = await startSample({ databaseUrl: url });
      expect(restarted.output()).toContain('Schema up to date');
      expect(await migrationLocks(true)).toBe(0);
      const answer = await deliver(restarted.url, ORDERS, paymentIntentSucceeded('evt_after_migrations'));
      expect(answer.status).toBe(200);
      expect(await db.count('SELECT count(*) FROM orders')).toBe(1);
    },
    THREE_STARTS_MS,
  );
});
