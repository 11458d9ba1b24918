import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import request from 'supertest';
import { ExpiredLeaseReporter, type ClaimOutcome, type ClaimOutcomeEvent } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { REPORTER_SCOPE } from '../../lib/idempotency.constants.js';
import { SHORT_LEASE_MS } from '../fixtures/external.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { downstreamCalls, leaseExpired } from '../support/lease-rows.js';
import { waitUntil } from '../support/wait-until.js';
import { parkDelivery } from '../support/parked-delivery.js';

const EXTERNAL = 'FixtureController.external';

/** One sample line of prom-client's text format. */
const claimsLine = (outcome: ClaimOutcome, value: number) =>
  `idempotency_claims_total{scope="${EXTERNAL}",outcome="${outcome}"} ${value}`;

describe.each(onAdapter('fastify'))('idempotency metrics (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let gates: Gates;
  const registry = new Registry();
  const events: ClaimOutcomeEvent[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        idempotency: {
          prometheus: { registers: [registry] },
          onOutcome: (event) => void events.push(event),
          leaseMs: SHORT_LEASE_MS,
          // run() is called by hand below.
          reporter: false,
        },
      }),
    ]);
    gates = running.app.get(Gates);
  });

  // A failed assertion must not leave a handler parked: its app could not close.
  afterEach(() => gates?.openAll());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const post = (body: object) => request(running.url).post('/external').send(body);
  const park = (id: string) => parkDelivery(running, '/external', { id });

  it('counts every outcome in prom-client, snapshot() and the onOutcome hook', async () => {
    // claimed, then replayed
    expect((await post({ id: 'evt_m_seq' })).status).toBe(200);
    expect((await post({ id: 'evt_m_seq' })).headers['idempotent-replayed']).toBe('true');

    // claimed, in_flight while parked
    const parked = await park('evt_m_busy');
    expect((await post({ id: 'evt_m_busy' })).status).toBe(409);
    gates.open('evt_m_busy');
    expect((await parked.answer).status).toBe(200);

    // claimed + failed, then reclaimed
    expect((await post({ id: 'evt_m_fail', fail: true })).status).toBe(500);
    expect((await post({ id: 'evt_m_fail' })).body.attempt).toBe(2);

    // claimed, reclaimed by a duplicate after the lease expired, lease_lost when the first finishes
    const slow = await park('evt_m_lost');
    await waitUntil(() => leaseExpired(db, EXTERNAL, 'evt_m_lost'), 'the lease to expire');
    expect((await post({ id: 'evt_m_lost' })).body.attempt).toBe(2);
    gates.open('evt_m_lost');
    expect((await slow.answer).status).toBe(200);
    expect(await downstreamCalls(db, 'evt_m_lost')).toHaveLength(2);

    // expired: a lease left behind by a dead worker, found by the reporter
    await db.pool.query(
      `INSERT INTO processed_events (scope, event_key, source, status, lease_token, lease_expires_at)
       VALUES ($1, 'evt_m_dead', $1, 'in_progress', gen_random_uuid(), now() - interval '1 minute')`,
      [EXTERNAL],
    );
    const report = await running.app.get(ExpiredLeaseReporter).run();
    expect(report.skipped).toBe(false);
    expect(report.expiredCount).toBe(1);

    // Every delivery outcome; the operator's (released, forgotten) are counted in operator.e2e-spec.ts,
    // the key checks' (key_conflict, key_unstable) in idempotency-key-checks.e2e-spec.ts, the
    // ordering guard's (stale, transaction mode only) in ordering.e2e-spec.ts.
    const expected: Omit<
      Record<ClaimOutcome, number>,
      'released' | 'forgotten' | 'key_conflict' | 'key_unstable' | 'stale'
    > = {
      claimed: 4,
      replayed: 1,
      in_flight: 1,
      failed: 1,
      reclaimed: 2,
      lease_lost: 1,
      expired: 1,
    };
    const text = await registry.metrics();
    for (const [outcome, value] of Object.entries(expected)) {
      expect(text).toContain(claimsLine(outcome as ClaimOutcome, value));
    }
    expect(text).toContain('# TYPE idempotency_claims_total counter');
    expect(text).toContain('# TYPE idempotency_expired_leases gauge');
    expect(text).toMatch(/^idempotency_expired_leases 1$/m);

    const metrics = running.app.get(IdempotencyMetrics);
    expect(metrics.snapshot()).toEqual({
      claims: { [EXTERNAL]: expected },
      expiredLeases: 1,
      poisonEvents: 0,
    });

    const hooked: Partial<Record<ClaimOutcome, number>> = {};
    for (const event of events) hooked[event.outcome] = (hooked[event.outcome] ?? 0) + 1;
    expect(hooked).toEqual(expected);
    expect(events.every((event) => event.scope === EXTERNAL)).toBe(true);
    expect(events.filter((event) => event.key === 'evt_m_lost').map((event) => event.outcome)).toEqual([
      'claimed',
      'reclaimed',
      'lease_lost',
    ]);
    expect(events.filter((event) => event.key === 'evt_m_dead').map((event) => event.outcome)).toEqual([
      'expired',
    ]);

    // Once the dead lease is re-claimed and completed, the next report brings the gauge back to 0.
    expect((await post({ id: 'evt_m_dead' })).body).toEqual({ processed: 'evt_m_dead', attempt: 2 });
    // A later tick, without waiting for one: forget this tick's claim.
    await db.pool.query('DELETE FROM processed_events WHERE scope = $1', [REPORTER_SCOPE]);
    expect((await running.app.get(ExpiredLeaseReporter).run()).expiredCount).toBe(0);
    expect(await registry.metrics()).toMatch(/^idempotency_expired_leases 0$/m);
    expect(metrics.snapshot().expiredLeases).toBe(0);
  });
});
