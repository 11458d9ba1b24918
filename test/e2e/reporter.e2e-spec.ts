import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { SchedulerRegistry } from '@nestjs/schedule';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { maintenanceSql } from '../support/claim-sql.js';
import { REPORTER_JOB_NAME, REPORTER_SCOPE } from '../../lib/idempotency.constants.js';
import { ExpiredLeaseReporter, type ExpiredLease, type IdempotencyModuleOptions } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type AdapterName, type RunningApp } from '../support/app.js';
import { startChildApp } from '../support/child-app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { leaseExpired } from '../support/lease-rows.js';
import { LogCapture } from '../support/log-capture.js';
import { waitUntil } from '../support/wait-until.js';

const EXTERNAL = 'FixtureController.external';
/** Interval of the scheduled reporter: short, so the test waits for real ticks. */
const REPORT_EVERY_MS = 300;
/** Tick of the reporters run by hand: long enough that two concurrent runs share one. */
const MANUAL_TICK_MS = 1_000;

/** A claim row written directly, as a crashed worker or an old completion would have left it. */
interface SeededClaim {
  scope: string;
  key: string;
  status: 'in_progress' | 'done' | 'failed';
  attempts?: number;
  /** Postgres interval added to now() for lease_expires_at, e.g. '-5 seconds'. */
  leaseFromNow?: string;
  /** Postgres interval subtracted from now() for completed_at, e.g. '40 days'. */
  completedAgo?: string;
  /** Postgres interval subtracted from now() for claimed_at. @default '1 hour' */
  claimedAgo?: string;
  lastError?: string;
}

async function seed(db: TestDatabase, claims: SeededClaim[]): Promise<void> {
  for (const claim of claims) {
    await db.pool.query(
      `INSERT INTO processed_events
         (scope, event_key, source, status, attempts, lease_token, claimed_at, lease_expires_at, completed_at, last_error)
       VALUES ($1, $2, 'seed', $3, $4, gen_random_uuid(), now() - $8::interval,
               now() + $5::interval, now() - $6::interval, $7)`,
      [
        claim.scope,
        claim.key,
        claim.status,
        claim.attempts ?? 1,
        claim.leaseFromNow ?? null,
        claim.completedAgo ?? null,
        claim.lastError ?? null,
        claim.claimedAgo ?? '1 hour',
      ],
    );
  }
}

describe.each(onAdapter('fastify'))('expired-lease reporter (%s)', (adapter: AdapterName) => {
  let db: TestDatabase;
  const apps: RunningApp[] = [];
  const logs = new LogCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
    logs.clear();
  });

  afterAll(async () => {
    await db?.drop();
  });

  /** Starts the fixture app with these options; the log capture is (re)installed after every start. */
  const start = async (idempotency: IdempotencyModuleOptions) => {
    const running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({ databaseUrl: db.url, idempotency }),
    ]);
    apps.push(running);
    running.app.useLogger(logs);
    return running;
  };

  const reporterOf = (running: RunningApp) => running.app.get(ExpiredLeaseReporter);
  const metricsOf = (running: RunningApp) => running.app.get(IdempotencyMetrics);

  /** A manual run in a tick of its own: forgets earlier tick claims so the run is not skipped. */
  const runAlone = async (running: RunningApp) => {
    await db.pool.query('DELETE FROM processed_events WHERE scope = $1', [REPORTER_SCOPE]);
    const result = await reporterOf(running).run();
    expect(result.skipped).toBe(false);
    return result;
  };

  it('reports the lease of a SIGKILLed worker on its next tick: warning, hook and gauge', async () => {
    const id = `evt_report_crash_${adapter}`;
    const hooked: ExpiredLease[] = [];
    const reporting = await start({
      reportEveryMs: REPORT_EVERY_MS,
      onExpiredLeases: (leases) => void hooked.push(...leases),
    });
    expect(reporting.app.get(SchedulerRegistry).getIntervals()).toContain(REPORTER_JOB_NAME);
    const worker = await startChildApp(adapter, {
      databaseUrl: db.url,
      idempotency: { leaseMs: 1_000, reporter: false },
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
    await waitUntil(() => leaseExpired(db, EXTERNAL, id), 'the dead worker’s lease to expire');

    // The scheduled job (no run() by hand) finds it: a handful of ticks at most.
    const [warning] = await logs.waitFor('warn', ['expired lease', `key ${id}`], 20 * REPORT_EVERY_MS);
    expect(warning.message).toContain(EXTERNAL);
    expect(warning.message).toContain('attempt 1');
    expect(warning.context).toBe('ExpiredLeaseReporter');
    expect(hooked.find((lease) => lease.key === id)).toMatchObject({
      scope: EXTERNAL,
      key: id,
      source: EXTERNAL,
      attempts: 1,
    });
    const metrics = metricsOf(reporting);
    expect(metrics.snapshot().expiredLeases).toBe(1);
    expect(metrics.snapshot().claims[EXTERNAL]?.expired).toBeGreaterThanOrEqual(1);

    // A redelivery re-claims and completes it; the next report brings the gauge back to 0.
    const redelivered = await request(reporting.url).post('/external').send({ id });
    expect(redelivered.body).toEqual({ processed: id, attempt: 2 });
    await waitUntil(
      () => metrics.snapshot().expiredLeases === 0,
      'the gauge to fall to 0',
      20 * REPORT_EVERY_MS,
    );
  });

  it('runs on a cron expression through SchedulerRegistry instead of an interval', async () => {
    const key = `evt_report_cron_${adapter}`;
    await seed(db, [{ scope: 'Seed.cron', key, status: 'in_progress', leaseFromNow: '-5 seconds' }]);
    // Cron ticks are claimed per minute: forget earlier claims so this minute's first run reports.
    await db.pool.query('DELETE FROM processed_events WHERE scope = $1', [REPORTER_SCOPE]);
    const running = await start({ reportCron: '* * * * * *' });
    const registry = running.app.get(SchedulerRegistry);
    expect(registry.getCronJobs().has(REPORTER_JOB_NAME)).toBe(true);
    expect(registry.getIntervals()).not.toContain(REPORTER_JOB_NAME);

    await logs.waitFor('warn', ['expired lease', `key ${key}`], 5_000);
    await db.pool.query(
      `UPDATE processed_events SET status = 'done', completed_at = now() WHERE event_key = $1`,
      [key],
    );
  });

  it('reports once per tick with two reporters on one database', async () => {
    const key = `evt_report_twice_${adapter}`;
    await seed(db, [{ scope: 'Seed.expired', key, status: 'in_progress', leaseFromNow: '-5 seconds' }]);
    const hooked = { a: 0, b: 0 };
    // reporter: false keeps the scheduled job out of the way; run() is called by hand, concurrently.
    const replicaA = await start({
      reporter: false,
      reportEveryMs: MANUAL_TICK_MS,
      onExpiredLeases: () => void hooked.a++,
    });
    const replicaB = await start({
      reporter: false,
      reportEveryMs: MANUAL_TICK_MS,
      onExpiredLeases: () => void hooked.b++,
    });

    let lastTick = -1;
    /** Runs both replicas concurrently, early in a fresh tick of the database clock, so both runs fall in it. */
    const runBoth = async () => {
      await waitUntil(async () => {
        const { rows } = await db.pool.query(
          `SELECT FLOOR(EXTRACT(EPOCH FROM now()) * 1000 / $1)::bigint AS tick,
                  (EXTRACT(EPOCH FROM now()) * 1000)::bigint % $1 AS into_tick`,
          [MANUAL_TICK_MS],
        );
        const fresh = Number(rows[0].tick) > lastTick && Number(rows[0].into_tick) < MANUAL_TICK_MS / 3;
        if (fresh) lastTick = Number(rows[0].tick);
        return fresh;
      }, 'the start of a fresh tick');
      logs.clear();
      const results = await Promise.all([reporterOf(replicaA).run(), reporterOf(replicaB).run()]);
      expect(results.filter((result) => !result.skipped)).toHaveLength(1);
      return results.find((result) => !result.skipped)!;
    };
    const gauges = () => [replicaA, replicaB].map((replica) => metricsOf(replica).snapshot().expiredLeases);

    for (let round = 1; round <= 2; round++) {
      const reported = await runBoth();
      expect(reported.expired.map((lease) => lease.key)).toEqual([key]);
      expect(logs.find('warn', 'expired lease', `key ${key}`)).toHaveLength(1);
      expect(hooked.a + hooked.b).toBe(round);
      // Both replicas export the gauge, the one that was skipped included.
      expect(gauges()).toEqual([1, 1]);
    }

    // Resolved (a redelivery completed it): the next tick reports nothing, and no replica keeps a stale 1.
    await db.pool.query(
      `UPDATE processed_events SET status = 'done', completed_at = now() WHERE event_key = $1`,
      [key],
    );
    const reported = await runBoth();
    expect(reported.expired).toEqual([]);
    expect(logs.find('warn', 'expired lease')).toEqual([]);
    expect(hooked.a + hooked.b).toBe(2);
    expect(gauges()).toEqual([0, 0]);
  });

  it('reports poison events separately from expired leases', async () => {
    const failing = `evt_poison_real_${adapter}`;
    await seed(db, [
      {
        scope: 'Seed.poison',
        key: `live_${adapter}`,
        status: 'in_progress',
        attempts: 3,
        leaseFromNow: '1 hour',
      },
      { scope: 'Seed.poison', key: `done_${adapter}`, status: 'done', attempts: 4, completedAgo: '1 hour' },
      { scope: 'Seed.poison', key: `once_${adapter}`, status: 'failed', attempts: 1, lastError: 'once' },
    ]);
    const running = await start({ reporter: false, maxAttempts: 2, leaseMs: 60_000 });
    // Two real failed attempts reach maxAttempts.
    for (let attempt = 1; attempt <= 2; attempt++) {
      const failed = await request(running.url).post('/external').send({ id: failing, fail: true });
      expect(failed.status).toBe(500);
    }

    const result = await runAlone(running);
    const poison = result.poison.filter((event) => event.key.endsWith(adapter));
    expect(poison).toHaveLength(2);
    expect(poison).toEqual(
      expect.arrayContaining([
        {
          scope: EXTERNAL,
          key: failing,
          source: EXTERNAL,
          status: 'failed',
          attempts: 2,
          lastError: 'downstream failed on purpose',
        },
        {
          scope: 'Seed.poison',
          key: `live_${adapter}`,
          source: 'seed',
          status: 'in_progress',
          attempts: 3,
          lastError: null,
        },
      ]),
    );
    // Poison is its own report: neither is an expired lease, and each gets an error line.
    expect(result.expired.map((lease) => lease.key)).not.toContain(failing);
    expect(result.expired.map((lease) => lease.key)).not.toContain(`live_${adapter}`);
    expect(
      logs.find('error', 'poison event', `key ${failing}`, 'last error: downstream failed on purpose'),
    ).toHaveLength(1);
    expect(logs.find('error', 'poison event', `key live_${adapter}`)).toHaveLength(1);
    expect(logs.find('error', `key done_${adapter}`)).toEqual([]);
  });

  it('deletes only done rows older than retentionDays, in bounded batches', async () => {
    const scope = `Seed.retention.${adapter}`;
    const old = Array.from({ length: 10 }, (_, i) => `old_${i}`);
    await seed(db, [
      ...old.map((key) => ({ scope, key, status: 'done' as const, completedAgo: '2 days' })),
      { scope, key: 'recent', status: 'done', completedAgo: '1 hour' },
      // Never finished, but claimed within retentionDays: kept whatever their other timestamps say.
      { scope, key: 'stuck', status: 'in_progress', leaseFromNow: '-2 days', completedAgo: '2 days' },
      { scope, key: 'failed', status: 'failed', completedAgo: '2 days', lastError: 'boom' },
    ]);
    const running = await start({ reporter: false, retentionDays: 1, retentionBatchSize: 3 });

    // Record each retention statement's row count, to see the batches.
    const dataSource = running.app.get(DataSource);
    const batches: number[] = [];
    const { retentionBatch } = maintenanceSql(3);
    const createQueryRunner = dataSource.createQueryRunner.bind(dataSource);
    dataSource.createQueryRunner = (...args) => {
      const runner = createQueryRunner(...args);
      const query = runner.query.bind(runner);
      runner.query = (async (sql: string, parameters?: unknown[], structured?: boolean) => {
        const result = await query(sql, parameters, structured as true);
        if (sql === retentionBatch) batches.push(result.affected ?? 0);
        return result;
      }) as typeof runner.query;
      return runner;
    };

    const result = await runAlone(running);
    expect(result.deleted).toBe(10);
    expect(batches).toEqual([3, 3, 3, 1]);
    const { rows } = await db.pool.query(
      'SELECT event_key, status FROM processed_events WHERE scope = $1 ORDER BY event_key',
      [scope],
    );
    expect(rows).toEqual([
      { event_key: 'failed', status: 'failed' },
      { event_key: 'recent', status: 'done' },
      { event_key: 'stuck', status: 'in_progress' },
    ]);
  });

  it('removes claims that never finished once they failed or their lease ran out more than retentionDays ago, and says which', async () => {
    const scope = `Seed.abandoned.${adapter}`;
    await seed(db, [
      { scope, key: 'dead_lease', status: 'in_progress', leaseFromNow: '-3 days', claimedAgo: '3 days' },
      { scope, key: 'gave_up', status: 'failed', attempts: 7, claimedAgo: '3 days', lastError: 'boom' },
      // Claimed long ago, but its lease is still live: a worker is on it.
      { scope, key: 'long_lease', status: 'in_progress', leaseFromNow: '1 hour', claimedAgo: '3 days' },
      // Claimed long ago and kept alive by its heartbeat until an hour ago: it died lately.
      { scope, key: 'died_lately', status: 'in_progress', leaseFromNow: '-1 hour', claimedAgo: '3 days' },
      { scope, key: 'failed_lately', status: 'failed', claimedAgo: '1 hour', lastError: 'boom' },
      { scope, key: 'done_lately', status: 'done', completedAgo: '1 hour' },
    ]);
    const running = await start({ reporter: false, retentionDays: 1, retentionBatchSize: 1 });

    const result = await runAlone(running);
    expect(
      result.abandoned.filter((claim) => claim.scope === scope).sort((a, b) => a.key.localeCompare(b.key)),
    ).toEqual([
      { scope, key: 'dead_lease', status: 'in_progress', attempts: 1 },
      { scope, key: 'gave_up', status: 'failed', attempts: 7 },
    ]);
    expect(logs.find('warn', 'retention removed', `key dead_lease`, 'a dead lease')).toHaveLength(1);
    expect(logs.find('warn', 'retention removed', `key gave_up`, 'failed after 7 attempts')).toHaveLength(1);
    const { rows } = await db.pool.query(
      'SELECT event_key FROM processed_events WHERE scope = $1 ORDER BY event_key',
      [scope],
    );
    expect(rows.map((row) => row.event_key)).toEqual([
      'died_lately',
      'done_lately',
      'failed_lately',
      'long_lease',
    ]);
  });

  it('reports transaction-mode events that keep failing as poison, counted outside their rolled-back transaction', async () => {
    const running = await start({ reporter: false, maxAttempts: 3 });
    const id = `evt_tx_poison_${adapter}`;
    for (let attempt = 1; attempt <= 3; attempt++) {
      const answer = await request(running.url).post('/orders').send({ id, fail: true });
      expect(answer.status).toBe(500);
    }
    const result = await runAlone(running);
    expect(result.poison.filter((event) => event.key === id)).toEqual([
      {
        scope: 'FixtureController.order',
        key: id,
        source: 'fixture',
        status: 'failed',
        attempts: 3,
        lastError: 'handler failed on purpose',
      },
    ]);
    expect(logs.find('error', 'poison event', `key ${id}`, 'after 3 attempts')).toHaveLength(1);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(0);
  });
});
