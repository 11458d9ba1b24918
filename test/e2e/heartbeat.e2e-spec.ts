import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { ExternalFixtureController, SHORT_LEASE_MS } from '../fixtures/external.fixture.js';
import { FixtureController, Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls, leaseExpired } from '../support/lease-rows.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { waitUntil } from '../support/wait-until.js';

const HEARTBEAT = 'ExternalFixtureController.withHeartbeat';
const NO_HEARTBEAT = 'ExternalFixtureController.withoutHeartbeat';
const EXTEND = 'ExternalFixtureController.extend';

describe.each(onAdapter('fastify'))('external mode lease renewal (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let gates: Gates;
  /** A second worker on the same database, for takeovers. */
  let other: RunningApp;
  let otherGates: Gates;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers: [FixtureController, ExternalFixtureController],
      }),
    ]);
    gates = running.app.get(Gates);
    other = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers: [FixtureController, ExternalFixtureController],
      }),
    ]);
    otherGates = other.app.get(Gates);
  });

  // A failed assertion must not leave a handler parked: its app could not close.
  afterEach(() => {
    gates?.openAll();
    otherGates?.openAll();
  });

  afterAll(async () => {
    await running?.close();
    await other?.close();
    await db?.drop();
  });

  /** True once the database clock is `ms` past the claim of `key`. */
  const claimedMoreThan = async (scope: string, key: string, ms: number) => {
    const { rows } = await db.pool.query(
      `SELECT now() > claimed_at + $3::double precision * interval '1 millisecond' AS past
       FROM processed_events WHERE scope = $1 AND event_key = $2`,
      [scope, key, ms],
    );
    return rows[0]?.past === true;
  };

  const leaseLost = () =>
    running.app.get(IdempotencyMetrics).snapshot().claims[NO_HEARTBEAT]?.lease_lost ?? 0;

  it('keeps the lease of a handler parked longer than its lease with heartbeat: true', async () => {
    const id = 'evt_hb_on';
    const { answer: first } = await parkDelivery(running, '/external/heartbeat', { id });
    const claimed = await claimRow(db, HEARTBEAT, id);

    // Twice the lease: without renewal it would have expired long ago.
    await waitUntil(() => claimedMoreThan(HEARTBEAT, id, 2 * SHORT_LEASE_MS), 'two leases to pass');
    const renewed = await claimRow(db, HEARTBEAT, id);
    expect(renewed).toMatchObject({ status: 'in_progress', attempts: 1 });
    expect(await leaseExpired(db, HEARTBEAT, id)).toBe(false);
    // Microseconds, as the database keeps them (lease-rows.ts): no two times collapse into one.
    expect(renewed!.lease_expires_at!).toBeGreaterThan(claimed!.lease_expires_at!);

    const duplicate = await request(running.url).post('/external/heartbeat').send({ id });
    expect(duplicate.status).toBe(409);
    expect(await claimRow(db, HEARTBEAT, id)).toMatchObject({
      status: 'in_progress',
      attempts: 1,
      lease_token: claimed!.lease_token,
    });
    expect(await downstreamCalls(db, id)).toEqual([]);

    gates.open(id);
    const done = await first;
    expect(done.status).toBe(200);
    expect(done.body.attempt).toBe(1);
    expect(await claimRow(db, HEARTBEAT, id)).toMatchObject({ status: 'done', attempts: 1 });
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);
  });

  it('lets the lease of a parked handler expire without heartbeat, so a duplicate re-claims', async () => {
    const id = 'evt_hb_off';
    const lostBefore = leaseLost();
    const { answer: first } = await parkDelivery(running, '/external/no-heartbeat', { id });
    const claimed = await claimRow(db, NO_HEARTBEAT, id);

    await waitUntil(() => leaseExpired(db, NO_HEARTBEAT, id), 'the lease to expire');
    // Nobody renewed it.
    const expired = await claimRow(db, NO_HEARTBEAT, id);
    expect(expired?.lease_expires_at).toEqual(claimed?.lease_expires_at);

    const duplicate = await request(running.url).post('/external/no-heartbeat').send({ id });
    expect(duplicate.status).toBe(200);
    expect(duplicate.body.attempt).toBe(2);
    expect(await claimRow(db, NO_HEARTBEAT, id)).toMatchObject({ status: 'done', attempts: 2 });

    gates.open(id);
    expect((await first).status).toBe(200);
    expect(leaseLost()).toBe(lostBefore + 1);
    expect(await claimRow(db, NO_HEARTBEAT, id)).toMatchObject({ status: 'done', attempts: 2 });
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }, { attempt: 1 }]);
  });

  it('extendLease() pushes the expiry while the lease is held', async () => {
    const id = 'evt_extend_held';
    const { answer: first } = await parkDelivery(running, '/external/extend', { id });
    const claimed = await claimRow(db, EXTEND, id);

    gates.open(id);
    const done = await first;
    expect(done.status).toBe(200);
    expect(done.body).toMatchObject({ held: true, attempt: 1 });
    const row = await claimRow(db, EXTEND, id);
    expect(row?.status).toBe('done');
    // At the database's precision: claim and extension can fall within one millisecond, and read
    // into Dates (milliseconds) the two expiries would then compare equal.
    expect(row!.lease_expires_at!).toBeGreaterThan(claimed!.lease_expires_at!);
  });

  it('extendLease() returns false once another worker has taken the lease over', async () => {
    const id = 'evt_extend_lost';
    const { answer: first } = await parkDelivery(running, '/external/extend', { id });
    await waitUntil(() => leaseExpired(db, EXTEND, id), 'the lease to expire');

    // Worker B (another app, its own gates) re-claims and parks, so the row is B's live lease.
    const { answer: takeover } = await parkDelivery(other, '/external/extend', { id });
    const rowB = await claimRow(db, EXTEND, id);
    expect(rowB).toMatchObject({ status: 'in_progress', attempts: 2 });

    gates.open(id);
    const late = await first;
    expect(late.status).toBe(200);
    expect(late.body).toMatchObject({ held: false, attempt: 1 });
    // The refused extension and the late completion left B's lease as it was.
    expect(await claimRow(db, EXTEND, id)).toEqual(rowB);

    otherGates.open(id);
    expect((await takeover).body).toMatchObject({ held: true, attempt: 2 });
    expect(await claimRow(db, EXTEND, id)).toMatchObject({
      status: 'done',
      attempts: 2,
      lease_token: rowB?.lease_token,
    });
  });
});
