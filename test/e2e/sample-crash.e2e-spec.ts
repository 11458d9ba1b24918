import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { pgBouncerPerFile, routeUrl, ROUTES } from '../support/database-routes.js';
import { FakeFulfilmentApi } from '../support/sample-downstream.js';
import { healthStatus, killAllSamples, startSample } from '../support/sample-process.js';
import {
  checkoutSessionCompleted,
  deliver,
  FULFILMENT,
  ORDERS,
  paymentIntentSucceeded,
} from '../support/sample-stripe.js';
import { waitUntil } from '../support/wait-until.js';

/** The sample's sessions carry this application_name (sample/database/database.module.ts). */
const SAMPLE_SESSIONS = 'stripe-sample';

/** PgBouncer in transaction mode in front of the run's PostgreSQL, for the `pgbouncer` route. */
const pooler = pgBouncerPerFile();

/**
 * The crash behaviour the sample must show, with real processes: SIGKILL inside an orders
 * transaction, SIGKILL during the fulfilment call, and a SIGTERM that lets in-flight work finish.
 * Directly, and with DATABASE_URL through PgBouncer in transaction mode.
 */
describe.each(ROUTES)('Stripe sample: crashes and shutdown (%s)', (route) => {
  let db: TestDatabase;
  let api: FakeFulfilmentApi;
  /** The sample's DATABASE_URL on this route. */
  let databaseUrl: string;

  beforeAll(async () => {
    db = await createTestDatabase(undefined, { fixtureSchema: false });
    api = await FakeFulfilmentApi.start();
    databaseUrl = routeUrl(route, db, pooler);
  });

  afterAll(async () => {
    await killAllSamples();
    await api?.close();
    await db?.drop();
  });

  const orders = (eventId: string) =>
    db.count('SELECT count(*) FROM orders WHERE stripe_event_id = $1', [eventId]);
  const claim = async (key: string) =>
    (
      await db.pool.query(
        `SELECT status, attempts, lease_expires_at <= now() AS expired
         FROM processed_events WHERE event_key = $1`,
        [key],
      )
    ).rows;

  it('SIGKILL inside an orders transaction leaves no claim; the next delivery makes the order once', async () => {
    // The process the redelivery reaches is booted beside the one that dies, as a second replica:
    // it holds nothing of the killed one's, so what it finds is only what the database kept.
    const [first, next] = await Promise.all([startSample({ databaseUrl }), startSample({ databaseUrl })]);
    const event = paymentIntentSucceeded('evt_killed_in_tx');

    // Park the handler inside its transaction: the claim is inserted, the order insert waits on
    // this lock. Nothing is committed yet when the process dies.
    const locker = await db.pool.connect();
    let parked: number;
    try {
      await locker.query('BEGIN');
      await locker.query('LOCK TABLE orders IN EXCLUSIVE MODE');
      const cut = deliver(first.url, ORDERS, event).then(
        (answer) => answer.status,
        () => 'no answer',
      );
      // The server session running the insert. Through PgBouncer too: it sets the client's
      // application_name on the server connection it lends, which stays lent (and its backend
      // busy) while the transaction is open; PgBouncer closes it when its client dies mid-transaction.
      let waiting: number[] = [];
      await waitUntil(async () => {
        const { rows } = await db.pool.query(
          `SELECT pid FROM pg_stat_activity
           WHERE datname = $1 AND application_name = $2 AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%orders%'`,
          [db.name, SAMPLE_SESSIONS],
        );
        waiting = rows.map((row) => row.pid);
        return waiting.length === 1;
      }, 'the order insert to wait on the table lock');
      parked = waiting[0];

      await first.kill();
      // The sender never got an answer: to Stripe this delivery failed and will be retried.
      expect(await cut).toBe('no answer');
    } finally {
      await locker.query('COMMIT');
      locker.release();
    }

    // The dead client's backend rolls back once it notices its client is gone.
    await waitUntil(
      async () => (await db.count('SELECT count(*) FROM pg_stat_activity WHERE pid = $1', [parked])) === 0,
      'the killed sample’s session to end',
    );
    expect(await claim('evt_killed_in_tx')).toEqual([]);
    expect(await orders('evt_killed_in_tx')).toBe(0);

    const redelivered = await deliver(next.url, ORDERS, event);
    expect(redelivered.status).toBe(200);
    expect(redelivered.headers['idempotent-replayed']).toBeUndefined();
    expect((await deliver(next.url, ORDERS, event)).headers['idempotent-replayed']).toBe('true');
    expect(await orders('evt_killed_in_tx')).toBe(1);
    expect(await claim('evt_killed_in_tx')).toEqual([{ status: 'done', attempts: 1, expired: null }]);
    await next.terminate();
  });

  it('SIGKILL during the fulfilment call leaves a lease: 409 inside it, re-claimed with the same Idempotency-Key after it, replayed later', async () => {
    // Two replicas on one database, as in production; a short lease and a fast reporter.
    const settings = { databaseUrl, fulfilmentUrl: api.url, leaseMs: 3_000, reportIntervalMs: 250 };
    const [doomed, survivor] = await Promise.all([startSample(settings), startSample(settings)]);
    const event = checkoutSessionCompleted('evt_killed_in_call');

    const held = api.holdNext();
    const cut = deliver(doomed.url, FULFILMENT, event).then(
      (answer) => answer.status,
      () => 'no answer',
    );
    await held.arrived;
    await doomed.kill();
    expect(await cut).toBe('no answer');
    expect(await claim('evt_killed_in_call')).toEqual([
      { status: 'in_progress', attempts: 1, expired: false },
    ]);

    // Inside the lease: the event may still be in flight somewhere, so never a 200.
    const inside = await deliver(survivor.url, FULFILMENT, event);
    expect(inside.status).toBe(409);
    expect(Number(inside.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(Number(inside.headers['retry-after'])).toBeLessThanOrEqual(3);
    expect(api.callsFor('evt_killed_in_call')).toHaveLength(1);

    await waitUntil(
      async () => (await claim('evt_killed_in_call'))[0]?.expired === true,
      'the lease to expire by the database clock',
    );
    await survivor.waitForLog(['expired lease', 'stripe.fulfilment', 'evt_killed_in_call']);
    const metrics = await (await fetch(`${survivor.url}/metrics`)).text();
    expect(metrics).toMatch(/^idempotency_expired_leases 1$/m);

    const after = await deliver(survivor.url, FULFILMENT, event);
    expect(after.status).toBe(200);
    expect(after.headers['idempotent-replayed']).toBeUndefined();
    const later = await deliver(survivor.url, FULFILMENT, event);
    expect(later.status).toBe(200);
    expect(later.headers['idempotent-replayed']).toBe('true');

    // The downstream saw the event twice, both times under the same key, so it can dedupe itself.
    expect(api.callsFor('evt_killed_in_call').map((call) => call.idempotencyKey)).toEqual([
      'evt_killed_in_call',
      'evt_killed_in_call',
    ]);
    expect(await claim('evt_killed_in_call')).toEqual([{ status: 'done', attempts: 2, expired: false }]);
    await survivor.terminate();
  });

  it('SIGTERM refuses new requests, lets the in-flight fulfilment finish, and exits 0', async () => {
    const sample = await startSample({ databaseUrl, fulfilmentUrl: api.url });
    const event = checkoutSessionCompleted('evt_drained');
    const held = api.holdNext();
    const inFlight = deliver(sample.url, FULFILMENT, event).then((answer) => answer);
    await held.arrived;

    sample.signal('SIGTERM');
    // Refused: 503 on a connection that is still open, or no connection at all once closed.
    await waitUntil(
      async () => (await healthStatus(sample.url)) !== 200,
      'the sample to refuse new requests',
    );
    const late = await deliver(sample.url, ORDERS, paymentIntentSucceeded('evt_after_sigterm')).then(
      (answer) => answer.status,
      () => 'refused',
    );
    expect([503, 'refused']).toContain(late);
    expect(await orders('evt_after_sigterm')).toBe(0);

    held.release(200);
    const answer = await inFlight;
    expect(answer.status).toBe(200);
    expect(answer.body.effect).toBe('fulfilment_sent');
    expect(await sample.exited).toEqual({ code: 0, signal: null });
    expect(await claim('evt_drained')).toEqual([{ status: 'done', attempts: 1, expired: false }]);
    expect(api.callsFor('evt_drained')).toHaveLength(1);
  });
});
