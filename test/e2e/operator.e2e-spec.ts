import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { REPORTER_SCOPE } from '../../lib/idempotency.constants.js';
import { ExpiredLeaseReporter, type ClaimOutcomeEvent } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { IdempotencyClaims, type ClaimListOptions, type ClaimRecord } from '../../lib/operator/index.js';
import { expireLease } from '../../lib/testing/index.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { startApp, type RunningApp } from '../support/app.js';
import { startChildApp } from '../support/child-app.js';
import { parkRun, runDelivery, type ParkedRun } from '../support/claim-runs.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls } from '../support/lease-rows.js';
import { LogCapture } from '../support/log-capture.js';
import { waitUntil } from '../support/wait-until.js';
import { releasedByOperator } from '../../lib/operator/claims.operator.js';

const EXTERNAL = 'FixtureController.external';
const ORDERS = 'FixtureController.order';
/** Small, so that two failed attempts make a poison claim. */
const MAX_ATTEMPTS = 2;
/** How long an action waits on a transaction-mode delivery's row lock before answering `locked`. */
const LOCK_WAIT_MS = 300;

/**
 * The operator service on a real app and database: every state a claim can be in is made by real
 * deliveries (IdempotencyService.run under scopes of the test's own, or HTTP), then listed, shown,
 * released and forgotten, and what the next delivery does afterwards is counted in effects.
 * HTTP is only the way in for a few deliveries here, so one adapter is enough.
 */
describe('IdempotencyClaims', () => {
  let db: TestDatabase;
  let running: RunningApp;
  const logs = new LogCapture();
  const outcomes: ClaimOutcomeEvent[] = [];
  const parked: ParkedRun[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp('express', [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        idempotency: {
          reporter: false,
          maxAttempts: MAX_ATTEMPTS,
          concurrentDuplicateWaitMs: LOCK_WAIT_MS,
          onOutcome: (event) => void outcomes.push(event),
        },
      }),
    ]);
    running.app.useLogger(logs);
  });

  afterEach(async () => {
    // A failed test must not leave a run parked (the app could not close), nor one finishing later.
    const runs = parked.splice(0);
    for (const run of runs) run.open();
    await Promise.all(runs.map((run) => run.result));
    running.app.get(Gates).openAll();
    logs.clear();
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const claims = () => running.app.get(IdempotencyClaims);
  const deliver = (scope: string, key: string, behaviour?: { fail?: boolean }) =>
    runDelivery(running.app, scope, key, behaviour);
  const park = async (scope: string, key: string) => {
    const run = await parkRun(running.app, scope, key);
    parked.push(run);
    return run;
  };
  const failTimes = async (scope: string, key: string, times: number) => {
    for (let attempt = 1; attempt <= times; attempt++) {
      await expect(deliver(scope, key, { fail: true })).rejects.toThrow('failed on purpose');
    }
  };
  const outcomesOf = (scope: string, key: string) =>
    outcomes.filter((event) => event.scope === scope && event.key === key).map((event) => event.outcome);
  const keys = (records: ClaimRecord[]) => records.map((record) => record.key);

  it('lists claims by state, scope and age, most recently claimed first, and shows one', async () => {
    const scope = 'Ops.list';
    await deliver(scope, 'done');
    await failTimes(scope, 'failed', 1);
    await failTimes(scope, 'poison', MAX_ATTEMPTS);
    await park(scope, 'live');
    await park(scope, 'expired');
    expect(await expireLease(running.app.get(DataSource), scope, 'expired')).toBe(true);
    await deliver('Ops.elsewhere', 'other');
    // A report leaves its tick claim in the table: the tools never list it.
    await running.app.get(ExpiredLeaseReporter).run({ force: true });

    const all = await claims().list({ scope });
    expect(keys(all)).toEqual(['expired', 'live', 'poison', 'failed', 'done']);
    const byKey = new Map(all.map((record) => [record.key, record]));
    expect(byKey.get('done')).toMatchObject({
      scope,
      source: scope,
      status: 'done',
      poison: false,
      attempts: 1,
      leaseLeftMs: null,
      lastError: null,
    });
    expect(byKey.get('done')!.completedAt).toBeInstanceOf(Date);
    expect(byKey.get('failed')).toMatchObject({ status: 'failed', poison: false, attempts: 1 });
    expect(byKey.get('failed')!.lastError).toBe('failed failed on purpose');
    expect(byKey.get('poison')).toMatchObject({ status: 'failed', poison: true, attempts: MAX_ATTEMPTS });
    const live = byKey.get('live')!;
    expect(live).toMatchObject({ status: 'in_progress', poison: false, attempts: 1, completedAt: null });
    expect(live.leaseToken).toMatch(/^[0-9a-f-]{36}$/);
    // The module's default lease (5 minutes), minus the moments since the claim.
    expect(live.leaseLeftMs).toBeGreaterThan(250_000);
    expect(live.leaseLeftMs).toBeLessThanOrEqual(300_000);
    expect(byKey.get('expired')).toMatchObject({ status: 'expired', leaseLeftMs: null, attempts: 1 });
    for (const record of all) {
      expect(record.ageMs).toBeGreaterThanOrEqual(0);
      expect(record.ageMs).toBeLessThan(60_000);
      expect(record.claimedAt).toBeInstanceOf(Date);
    }

    const only = async (options: ClaimListOptions) => keys(await claims().list({ scope, ...options }));
    expect(await only({ status: 'in_progress' })).toEqual(['live']);
    expect(await only({ status: 'expired' })).toEqual(['expired']);
    expect(await only({ status: 'failed' })).toEqual(['poison', 'failed']);
    expect(await only({ status: 'poison' })).toEqual(['poison']);
    expect(await only({ status: 'done' })).toEqual(['done']);
    expect(await only({ limit: 2 })).toEqual(['expired', 'live']);

    // Without a scope: every scope, never the reporter's ticks.
    const everything = await claims().list({ limit: 1_000 });
    expect(everything.map((record) => record.scope)).toEqual(
      expect.arrayContaining([scope, 'Ops.elsewhere']),
    );
    expect(everything.filter((record) => record.scope === REPORTER_SCOPE)).toEqual([]);
    expect(await db.count('SELECT count(*) FROM processed_events WHERE scope = $1', [REPORTER_SCOPE])).toBe(
      1,
    );

    // Age: a claim last claimed an hour ago, as an old one would be.
    await db.pool.query(
      `UPDATE processed_events SET claimed_at = now() - interval '1 hour' WHERE scope = $1 AND event_key = 'done'`,
      [scope],
    );
    expect(await only({ olderThanMs: 30 * 60_000 })).toEqual(['done']);
    expect(keys(await claims().list({ scope, olderThanMs: 0 }))).toHaveLength(5);
    const aged = await claims().show(scope, 'done');
    expect(aged!.ageMs).toBeGreaterThanOrEqual(3_600_000);
    expect(aged!.ageMs).toBeLessThan(3_660_000);

    expect(await claims().show(scope, 'live')).toEqual({
      ...live,
      ageMs: expect.any(Number),
      leaseLeftMs: expect.any(Number),
    });
    expect(await claims().show(scope, 'never-delivered')).toBeUndefined();

    for (const bad of [{ status: 'stuck' }, { limit: 0 }, { limit: 1.5 }, { olderThanMs: -1 }]) {
      await expect(claims().list(bad as never)).rejects.toThrow(TypeError);
    }
  });

  it("releases a dead worker's live lease: the redelivery claims it at once (attempt 2) and completes, one effect", async () => {
    const id = 'evt_release_dead';
    const worker = await startChildApp('express', {
      databaseUrl: db.url,
      idempotency: { reporter: false, leaseMs: 300_000 },
    });
    try {
      const lost = request(worker.url)
        .post('/external')
        .send({ id, block: true })
        .catch(() => undefined);
      await worker.entered(id);
      await worker.kill();
      await lost;
    } finally {
      await worker.kill();
    }
    // Stuck: its lease has minutes left, so a redelivery is answered in flight.
    expect((await request(running.url).post('/external').send({ id })).status).toBe(409);
    const before = await claimRow(db, EXTERNAL, id);
    expect(before).toMatchObject({ status: 'in_progress', attempts: 1 });

    const result = await claims().release(EXTERNAL, id);
    expect(result).toEqual({
      released: true,
      leaseWasLive: true,
      claim: expect.objectContaining({
        scope: EXTERNAL,
        key: id,
        status: 'failed',
        attempts: 1,
        leaseToken: null,
        lastError: releasedByOperator(),
      }),
    });
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({
      status: 'failed',
      attempts: 1,
      lease_token: null,
      last_error: releasedByOperator(),
      // The lease's expiry is kept: it tells whether the lease was live when released.
      lease_expires_at: before!.lease_expires_at,
    });
    const [warning] = logs.find('warn', `released ${EXTERNAL} key ${id}`);
    expect(warning.context).toBe('IdempotencyClaims');
    expect(warning.message).toContain('its lease was still live');
    expect(warning.message).toContain('attempt 2');

    const redelivered = await request(running.url).post('/external').send({ id });
    expect(redelivered.status).toBe(200);
    expect(redelivered.body).toEqual({ processed: id, attempt: 2 });
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({ status: 'done', attempts: 2, last_error: null });
    expect(outcomesOf(EXTERNAL, id)).toEqual(['in_flight', 'released', 'reclaimed']);
    expect(running.app.get(IdempotencyMetrics).snapshot().claims[EXTERNAL]).toMatchObject({ released: 1 });
  });

  it('a holder still running when its lease is released finds it lost: its completion changes nothing', async () => {
    const scope = 'Ops.release-live';
    const holder = await park(scope, 'held');
    const result = await claims().release(scope, 'held');
    expect(result).toMatchObject({ released: true, leaseWasLive: true });

    expect(await deliver(scope, 'held')).toBe(2);
    holder.open();
    // The holder did its work (why a live lease is released only when its worker is stuck)...
    expect(await holder.result).toBe(1);
    expect(await downstreamCalls(db, 'held')).toEqual([{ attempt: 2 }, { attempt: 1 }]);
    // ...but its completion was fenced out: the claim is the redelivery's.
    expect(await claimRow(db, scope, 'held')).toMatchObject({ status: 'done', attempts: 2 });
    expect(outcomesOf(scope, 'held')).toEqual(['claimed', 'released', 'reclaimed', 'lease_lost']);
    expect(logs.find('error', 'Lease lost', `${scope} key held`)).toHaveLength(1);
  });

  it("a released lease stays released while its holder's heartbeat runs", async () => {
    const scope = 'Ops.release-heartbeat';
    const leaseMs = 600;
    const holder = await parkRun(running.app, scope, 'beating', { leaseMs, heartbeat: true });
    parked.push(holder);
    // The heartbeat renews the lease every 200 ms: it is still live after its first lease ran out.
    const first = (await claimRow(db, scope, 'beating'))!.lease_expires_at!;
    await waitUntil(
      async () => (await claimRow(db, scope, 'beating'))!.lease_expires_at! > first,
      'the heartbeat to renew the lease',
    );
    expect(await claims().release(scope, 'beating')).toMatchObject({ released: true, leaseWasLive: true });
    const released = (await claimRow(db, scope, 'beating'))!;
    // Three heartbeat intervals past the released lease's expiry, by the database clock.
    await waitUntil(async () => {
      const { rows } = await db.pool.query(
        `SELECT now() > to_timestamp($1::double precision / 1e6) + interval '600 milliseconds' AS past`,
        [released.lease_expires_at!.toString()],
      );
      return rows[0].past === true;
    }, 'three heartbeat intervals past the released lease');
    expect(await claimRow(db, scope, 'beating')).toEqual(released);
    expect(released).toMatchObject({ status: 'failed', lease_token: null });
  });

  it('releases an expired lease, and refuses done, failed and unknown claims without changing them', async () => {
    const scope = 'Ops.release-refused';
    await park(scope, 'expired');
    await expireLease(running.app.get(DataSource), scope, 'expired');
    const expired = await claims().release(scope, 'expired');
    expect(expired).toMatchObject({ released: true, leaseWasLive: false, claim: { status: 'failed' } });
    expect(logs.find('warn', `released ${scope} key expired`, 'its lease had expired')).toHaveLength(1);

    await deliver(scope, 'done');
    await failTimes(scope, 'failed', 1);
    const rowsBefore = await Promise.all(
      ['done', 'failed', 'expired'].map((key) => claimRow(db, scope, key)),
    );
    const refusals = {
      done: await claims().release(scope, 'done'),
      failed: await claims().release(scope, 'failed'),
      // Released once already: it holds no lease any more.
      expired: await claims().release(scope, 'expired'),
      unknown: await claims().release(scope, 'unknown'),
    };
    expect(refusals.done).toMatchObject({
      released: false,
      refusal: { reason: 'done', claim: { key: 'done' } },
    });
    expect(refusals.failed).toMatchObject({ released: false, refusal: { reason: 'failed' } });
    expect(refusals.expired).toMatchObject({ released: false, refusal: { reason: 'failed' } });
    expect(refusals.unknown).toEqual({
      released: false,
      refusal: { reason: 'not_found', message: expect.stringContaining(`no claim of ${scope} key unknown`) },
    });
    expect(await Promise.all(['done', 'failed', 'expired'].map((key) => claimRow(db, scope, key)))).toEqual(
      rowsBefore,
    );
    for (const key of ['done', 'failed', 'expired', 'unknown']) {
      expect(logs.find('log', 'release refused', `${scope} key ${key}`)).toHaveLength(1);
    }
    // Refusals are not counted; the one release is.
    expect(running.app.get(IdempotencyMetrics).snapshot().claims[scope]).toMatchObject({ released: 1 });
    expect(outcomes.filter((event) => event.scope === scope && event.outcome === 'released')).toHaveLength(1);
  });

  it('forgets a done key only with force: its next delivery processes the event again', async () => {
    const id = 'evt_forget_done';
    const post = () => request(running.url).post('/external').send({ id });
    expect((await post()).body).toEqual({ processed: id, attempt: 1 });
    const replay = await post();
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);

    const unforced = await claims().forget(EXTERNAL, id);
    expect(unforced).toMatchObject({
      forgotten: false,
      refusal: { reason: 'force_required', claim: { key: id, status: 'done' } },
    });
    expect(unforced.forgotten === false && unforced.refusal.message).toContain('force: true');
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({ status: 'done' });
    expect(logs.find('log', 'forget refused', `key ${id}`)).toHaveLength(1);

    const forced = await claims().forget(EXTERNAL, id, { force: true });
    expect(forced).toMatchObject({
      forgotten: true,
      claim: { scope: EXTERNAL, key: id, status: 'done', attempts: 1 },
    });
    expect(await claimRow(db, EXTERNAL, id)).toBeUndefined();
    const [warning] = logs.find('warn', `forgot ${EXTERNAL} key ${id}`);
    expect(warning.context).toBe('IdempotencyClaims');
    expect(warning.message).toContain('runs the handler again');

    const again = await post();
    expect(again.body).toEqual({ processed: id, attempt: 1 });
    expect(again.headers['idempotent-replayed']).toBeUndefined();
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }, { attempt: 1 }]);
    expect(outcomesOf(EXTERNAL, id)).toEqual(['claimed', 'replayed', 'forgotten', 'claimed']);
    expect(running.app.get(IdempotencyMetrics).snapshot().claims[EXTERNAL]).toMatchObject({ forgotten: 1 });
  });

  it('refuses to forget a live lease even with force; released, the claim is forgotten and starts over', async () => {
    const scope = 'Ops.forget-live';
    const holder = await park(scope, 'live');
    const refused = await claims().forget(scope, 'live', { force: true });
    expect(refused).toMatchObject({
      forgotten: false,
      refusal: { reason: 'live_lease', claim: { status: 'in_progress' } },
    });
    expect(refused.forgotten === false && refused.refusal.message).toContain('release it first');
    expect(await claimRow(db, scope, 'live')).toMatchObject({ status: 'in_progress', attempts: 1 });

    expect(await claims().release(scope, 'live')).toMatchObject({ released: true });
    expect(await claims().forget(scope, 'live', { force: true })).toMatchObject({
      forgotten: true,
      claim: { status: 'failed', attempts: 1 },
    });
    // A first delivery again: attempt 1.
    expect(await deliver(scope, 'live')).toBe(1);
    holder.open();
    expect(await holder.result).toBe(1);
    expect(outcomesOf(scope, 'live')).toEqual(['claimed', 'released', 'forgotten', 'claimed', 'lease_lost']);
    expect(await claims().forget(scope, 'never', { force: true })).toMatchObject({
      forgotten: false,
      refusal: { reason: 'not_found' },
    });
  });

  it("answers locked, deleting nothing, while a transaction-mode retry holds the claim's row", async () => {
    const id = 'evt_forget_locked';
    expect((await request(running.url).post('/orders').send({ id, fail: true })).status).toBe(500);
    expect(await claimRow(db, ORDERS, id)).toMatchObject({ status: 'failed', attempts: 1 });
    // The retry claims the failed row in its transaction and parks there, holding the row lock.
    const gates = running.app.get(Gates);
    const retry = request(running.url)
      .post('/orders')
      .send({ id, block: true })
      .then((response) => response);
    await gates.entered(id);

    const started = performance.now();
    const result = await claims().forget(ORDERS, id, { force: true });
    expect(performance.now() - started).toBeGreaterThanOrEqual(LOCK_WAIT_MS - 50);
    expect(result).toMatchObject({
      forgotten: false,
      refusal: { reason: 'locked', claim: { status: 'failed' } },
    });
    expect(logs.find('log', 'forget refused', `${ORDERS} key ${id}`, 'try again')).toHaveLength(1);

    gates.open(id);
    expect((await retry).body).toEqual({ processed: id });
    // What the retry committed stands: the forget did not delete it behind its back.
    expect(await claimRow(db, ORDERS, id)).toMatchObject({ status: 'done', attempts: 2 });
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(1);
  });
});

describe('ExpiredLeaseReporter.run({ force: true })', () => {
  let db: TestDatabase;
  let running: RunningApp;
  const logs = new LogCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp('express', [
      WebhookFixtureModule.forDatabase({ databaseUrl: db.url, idempotency: { reporter: false } }),
    ]);
    running.app.useLogger(logs);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  it('reports a tick another replica already took', async () => {
    const scope = 'Ops.report';
    const holder = await parkRun(running.app, scope, 'dead');
    try {
      expect(await expireLease(running.app.get(DataSource), scope, 'dead')).toBe(true);
      // Another replica took this tick and the next (the run could fall on a boundary).
      await db.pool.query(
        `INSERT INTO processed_events (scope, event_key, source, status, completed_at)
         SELECT $1, (FLOOR(EXTRACT(EPOCH FROM now()) * 1000 / 60000)::bigint + step)::text, 'idempotency', 'done', now()
         FROM generate_series(0, 1) AS step`,
        [REPORTER_SCOPE],
      );
      const reporter = running.app.get(ExpiredLeaseReporter);
      expect(await reporter.run()).toMatchObject({ skipped: true, expired: [], poison: [] });
      expect(logs.find('warn', 'expired lease')).toEqual([]);

      for (let run = 1; run <= 2; run++) {
        const forced = await reporter.run({ force: true });
        expect(forced.skipped).toBe(false);
        expect(forced.expiredCount).toBe(1);
        expect(forced.expired).toEqual([expect.objectContaining({ scope, key: 'dead', attempts: 1 })]);
        expect(logs.find('warn', 'expired lease', `${scope} key dead`)).toHaveLength(run);
      }
      expect(running.app.get(IdempotencyMetrics).snapshot().expiredLeases).toBe(1);
    } finally {
      holder.open();
      await holder.result;
    }
  });
});
