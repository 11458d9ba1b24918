import { randomBytes } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Test, type TestingModule } from '@nestjs/testing';
import { Queue, type Job, type JobsOptions } from 'bullmq';
import { DataSource } from 'typeorm';
import { EventInFlightError } from '../../lib/errors/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { expireLease } from '../../lib/testing/index.js';
import {
  BullWorkerFixtureModule,
  EXTERNAL_QUEUE,
  EXTERNAL_SCOPE,
  ExternalOrdersProcessor,
  failedOnPurpose,
  ORDERS_QUEUE,
  ORDERS_SCOPE,
  type BullWorkerSettings,
  type OrderJob,
  type ProcessorName,
} from '../fixtures/bullmq.fixture.js';
import { Gates } from '../fixtures/webhook-fixture.module.js';
import { startBullWorker, type BullWorkerProcess } from '../support/bullmq-worker.js';
import { createTestDatabase, openTransactions, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls } from '../support/lease-rows.js';
import { LogCapture } from '../support/log-capture.js';
import { testRedis } from '../support/redis-server.js';
import { waitUntil } from '../support/wait-until.js';

/** How long a job may take to finish, retries and a stalled-job hand-over included. */
const SETTLE_MS = 30_000;
/** Retries of a job answered in flight: far more than any test needs, so none fails permanently. */
const RETRY: JobsOptions = { attempts: 50, backoff: { type: 'fixed', delay: 100 } };

const inFlight = (eventId: string) => `Event ${eventId} is being processed by another delivery; retry later`;

/**
 * `@Idempotent` on a `@nestjs/bullmq` WorkerHost's `process(job)`, with real BullMQ workers on the
 * run's Redis and real Postgres: every event has exactly one effect however many jobs carry it,
 * however many workers race for them, and whichever worker dies holding one.
 */
describe('@Idempotent on BullMQ consumers', () => {
  const redis = testRedis();
  let db: TestDatabase;
  let dataSource: DataSource;
  /** Run after each test, last registered first: workers before the queues they consume. */
  const cleanups: (() => Promise<void>)[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
    // For expireLease(), the library's own test helper.
    dataSource = await new DataSource({ type: 'postgres', url: db.url }).initialize();
  });

  afterEach(async () => {
    // Every cleanup runs, even after one failed: a live worker would keep Jest from exiting.
    const failures: unknown[] = [];
    for (const cleanup of cleanups.splice(0).reverse())
      await cleanup().catch((error) => failures.push(error));
    if (failures.length > 0) throw failures[0];
  });

  afterAll(async () => {
    await dataSource?.destroy();
    await db?.drop();
  });

  /** A key prefix of its own, so no other test or run shares the queue on the shared Redis. */
  const newPrefix = () => `idem-bull-${randomBytes(6).toString('hex')}`;

  const openQueue = (name: string, prefix: string) => {
    const queue = new Queue<OrderJob>(name, { connection: redis, prefix });
    cleanups.push(async () => {
      await queue.obliterate({ force: true });
      await queue.close();
    });
    return queue;
  };

  const settingsFor = (prefix: string, tag: string, processors: ProcessorName[]): BullWorkerSettings => ({
    databaseUrl: db.url,
    redis: { host: redis.host, port: redis.port },
    prefix,
    tag,
    processors,
  });

  /** A worker app in this process, for tests that read its metrics and open its gates. */
  const startWorkerApp = async (settings: BullWorkerSettings): Promise<TestingModule> => {
    const app = await Test.createTestingModule({
      imports: [BullWorkerFixtureModule.forSettings(settings)],
    }).compile();
    app.useLogger(new LogCapture());
    await app.init();
    cleanups.push(async () => {
      // A parked job would keep worker.close() waiting.
      app.get(Gates).openAll();
      await app.close();
    });
    return app;
  };

  /** A worker app in a child process, for tests that race processes or SIGKILL one. */
  const startChild = async (settings: BullWorkerSettings): Promise<BullWorkerProcess> => {
    const child = await startBullWorker(settings);
    cleanups.push(() => child.kill());
    return child;
  };

  /** The job once it is completed or has failed for good (not while it waits for a retry). */
  const settled = async (queue: Queue<OrderJob>, jobId: string): Promise<Job<OrderJob>> => {
    await waitUntil(
      async () => ['completed', 'failed'].includes(await queue.getJobState(jobId)),
      `job ${jobId} to complete or fail`,
      SETTLE_MS,
    );
    return (await queue.getJob(jobId))!;
  };

  const ordersOf = async (eventId: string) =>
    (await db.pool.query<{ amount: number }>('SELECT amount FROM orders WHERE event_id = $1', [eventId]))
      .rows;

  it('runs an event added as two jobs once: the second job completes as replayed', async () => {
    const prefix = newPrefix();
    const queue = openQueue(ORDERS_QUEUE, prefix);
    const app = await startWorkerApp(settingsFor(prefix, 'main', ['orders']));
    const eventId = 'evt_bull_twice';

    await queue.add('order', { eventId }, { jobId: 'twice-1' });
    const first = await settled(queue, 'twice-1');
    await queue.add('order', { eventId }, { jobId: 'twice-2' });
    const second = await settled(queue, 'twice-2');

    expect(await queue.getJobState('twice-1')).toBe('completed');
    expect(await queue.getJobState('twice-2')).toBe('completed');
    expect(first.returnvalue).toEqual({ processed: eventId, worker: 'main', attempt: 1 });
    // process() returned undefined without running: nothing to store.
    expect(second.returnvalue).toBeNull();
    expect(second.failedReason).toBeUndefined();

    expect(await ordersOf(eventId)).toEqual([{ amount: 1 }]);
    expect(await claimRow(db, ORDERS_SCOPE, eventId)).toMatchObject({ status: 'done' });
    expect(await db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [eventId])).toBe(1);
    expect(app.get(IdempotencyMetrics).snapshot().claims).toEqual({
      [ORDERS_SCOPE]: { claimed: 1, replayed: 1 },
    });
  });

  it('gives one effect per event when two worker processes race on duplicate jobs', async () => {
    const prefix = newPrefix();
    const queue = openQueue(ORDERS_QUEUE, prefix);
    // Both are consuming before the first job exists.
    const workers = await Promise.all([
      startChild(settingsFor(prefix, 'A', ['orders'])),
      startChild(settingsFor(prefix, 'B', ['orders'])),
    ]);
    const events = Array.from({ length: 5 }, (_, index) => `evt_bull_race_${index}`);
    const copies = 4;
    // Copy 0 of every event first: BullMQ hands jobs out in order, so the first five jobs taken
    // are one per event and each claims at once. Every job parks after its claim, so duplicates
    // meet a held claim, in their own process and in the other one.
    const jobs = Array.from({ length: copies }, (_, copy) =>
      events.map((eventId) => ({
        name: 'order',
        data: { eventId, parkIn: '*' },
        opts: { ...RETRY, jobId: `${eventId}-copy-${copy}` },
      })),
    ).flat();
    await queue.addBulk(jobs);

    // All five claims held at once: a worker runs at most WORKER_CONCURRENCY (4) jobs, so both
    // workers hold some of them. That is what makes this a race between processes, every run.
    await waitUntil(
      () => events.every((eventId) => workers.some((worker) => worker.hasEntered(eventId))),
      'every event to be claimed and parked in one of the workers',
      SETTLE_MS,
    );
    const claimedIn = new Map(
      events.map((eventId) => [eventId, workers.filter((worker) => worker.hasEntered(eventId))]),
    );
    for (const [eventId, holders] of claimedIn) {
      expect({ eventId, holders: holders.map((worker) => worker.tag) }).toEqual({
        eventId,
        holders: [expect.any(String)],
      });
    }
    expect(new Set([...claimedIn.values()].map(([worker]) => worker.tag))).toEqual(new Set(['A', 'B']));
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = ANY($1)', [events])).toBe(0);
    for (const eventId of events) for (const worker of workers) worker.open(eventId);

    const total = events.length * copies;
    await waitUntil(
      async () => {
        const counts = await queue.getJobCounts('completed', 'failed');
        return counts.completed + counts.failed === total;
      },
      `all ${total} jobs to finish`,
      SETTLE_MS,
    );
    expect(await queue.getJobCounts('completed', 'failed')).toEqual({ completed: total, failed: 0 });

    const finished = await queue.getJobs(['completed']);
    expect(finished).toHaveLength(total);
    for (const eventId of events) {
      const ofEvent = finished.filter((job) => job.data.eventId === eventId);
      expect(ofEvent).toHaveLength(copies);
      // Exactly one job ran the work, in the worker that held the claim; every other copy was
      // replayed (returned undefined, stored as null) once it had committed.
      const ran = ofEvent.filter((job) => job.returnvalue !== null);
      expect({ eventId, ran: ran.map((job) => job.returnvalue.worker) }).toEqual({
        eventId,
        ran: [claimedIn.get(eventId)![0].tag],
      });
      expect(await ordersOf(eventId)).toHaveLength(1);
      expect(await claimRow(db, ORDERS_SCOPE, eventId)).toMatchObject({ status: 'done' });
    }
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = ANY($1)', [events])).toBe(
      events.length,
    );

    // Across both processes: one claim per event, one replay per other copy, and an in-flight
    // answer for each attempt BullMQ retried (a duplicate that waited past concurrentDuplicateWaitMs).
    const retries = finished.reduce((sum, job) => sum + job.attemptsMade - 1, 0);
    const totals: Record<string, number> = {};
    for (const snapshot of await Promise.all(workers.map((worker) => worker.metrics()))) {
      for (const [outcome, count] of Object.entries(snapshot.claims[ORDERS_SCOPE] ?? {})) {
        totals[outcome] = (totals[outcome] ?? 0) + count!;
      }
    }
    expect(totals).toEqual({
      claimed: events.length,
      replayed: total - events.length,
      ...(retries > 0 && { in_flight: retries }),
    });
  });

  it('hands the job of a worker SIGKILLed inside its transaction to another worker: one effect', async () => {
    const prefix = newPrefix();
    const queue = openQueue(ORDERS_QUEUE, prefix);
    const eventId = 'evt_bull_killed_tx';
    const doomed = await startChild(settingsFor(prefix, 'A', ['orders-quick-stall']));

    await queue.add('order', { eventId, parkIn: 'A' }, { ...RETRY, jobId: 'killed-tx' });
    await doomed.entered(eventId);
    // A's insert and claim are in its open transaction: invisible to everyone else.
    expect(await ordersOf(eventId)).toEqual([]);
    expect(await claimRow(db, ORDERS_SCOPE, eventId)).toBeUndefined();
    expect(await openTransactions(db)).toBe(1);
    expect(await queue.getJobState('killed-tx')).toBe('active');

    // B is consuming while A holds the job: it cannot take it until A's lock lapses.
    await startChild(settingsFor(prefix, 'B', ['orders-quick-stall']));
    await doomed.kill();

    const job = await settled(queue, 'killed-tx');
    expect(await queue.getJobState('killed-tx')).toBe('completed');
    // Handed over by BullMQ's stalled-job check, not retried after a failure.
    expect(job.stalledCounter).toBe(1);
    expect(job.failedReason).toBeUndefined();
    expect(job.returnvalue).toEqual({ processed: eventId, worker: 'B', attempt: 1 });
    // A's uncommitted insert died with its connection; B's is the only one.
    expect(await ordersOf(eventId)).toEqual([{ amount: 1 }]);
    expect(await claimRow(db, ORDERS_SCOPE, eventId)).toMatchObject({ status: 'done' });
  });

  it('keeps a SIGKILLed worker’s lease: the new worker is answered in flight until it ends, then re-claims', async () => {
    const prefix = newPrefix();
    const queue = openQueue(EXTERNAL_QUEUE, prefix);
    const eventId = 'evt_bull_killed_lease';
    const doomed = await startChild(settingsFor(prefix, 'A', ['external-quick-stall']));

    await queue.add('order', { eventId, parkIn: 'A' }, { ...RETRY, jobId: 'killed-lease' });
    await doomed.entered(eventId);
    const dead = await claimRow(db, EXTERNAL_SCOPE, eventId);
    expect(dead).toMatchObject({ status: 'in_progress', attempts: 1 });

    await startChild(settingsFor(prefix, 'B', ['external-quick-stall']));
    await doomed.kill();

    // B takes the stalled job; A's lease is live, so each of B's attempts fails in flight and
    // BullMQ retries it with its backoff. Two failures show it is retried, not given up.
    await waitUntil(
      async () => ((await queue.getJob('killed-lease'))?.attemptsMade ?? 0) >= 2,
      'two of B’s attempts to be answered in flight',
      SETTLE_MS,
    );
    const retried = (await queue.getJob('killed-lease'))!;
    expect(retried.stalledCounter).toBe(1);
    expect(retried.failedReason).toBe(inFlight(eventId));
    expect(retried.stacktrace!.length).toBeGreaterThanOrEqual(2);
    for (const stack of retried.stacktrace!) expect(stack).toContain(inFlight(eventId));
    expect(await downstreamCalls(db, eventId)).toEqual([]);
    expect(await claimRow(db, EXTERNAL_SCOPE, eventId)).toMatchObject({
      status: 'in_progress',
      attempts: 1,
      lease_token: dead!.lease_token,
    });

    // The lease runs out (ended now rather than waited for, so no timing decides the test).
    expect(await expireLease(dataSource, EXTERNAL_SCOPE, eventId)).toBe(true);
    const job = await settled(queue, 'killed-lease');
    expect(await queue.getJobState('killed-lease')).toBe('completed');
    expect(job.returnvalue).toEqual({ processed: eventId, worker: 'B', attempt: 2 });
    // A was parked before its call: the side effect ran once, by B, on the claim's attempt 2.
    expect(await downstreamCalls(db, eventId)).toEqual([{ attempt: 2 }]);
    const reclaimed = await claimRow(db, EXTERNAL_SCOPE, eventId);
    expect(reclaimed).toMatchObject({ status: 'done', attempts: 2 });
    expect(reclaimed!.lease_token).not.toBe(dead!.lease_token);
  });

  it('retries a job that threw with BullMQ’s backoff; the failed attempt’s writes were rolled back', async () => {
    const prefix = newPrefix();
    const queue = openQueue(ORDERS_QUEUE, prefix);
    const app = await startWorkerApp(settingsFor(prefix, 'main', ['orders']));
    const eventId = 'evt_bull_retry';

    await queue.add(
      'order',
      { eventId, failAttempts: 1 },
      { jobId: 'retry', attempts: 3, backoff: { type: 'fixed', delay: 100 } },
    );
    const job = await settled(queue, 'retry');

    expect(await queue.getJobState('retry')).toBe('completed');
    expect(job.attemptsMade).toBe(2);
    expect(job.stacktrace).toHaveLength(1);
    expect(job.stacktrace![0]).toContain(failedOnPurpose(1));
    expect(job.returnvalue).toEqual({ processed: eventId, worker: 'main', attempt: 2 });
    // Attempt 1 wrote amount 1 and threw: rolled back with its claim. Only attempt 2's row exists.
    expect(await ordersOf(eventId)).toEqual([{ amount: 2 }]);
    expect(await claimRow(db, ORDERS_SCOPE, eventId)).toMatchObject({ status: 'done' });
    expect(app.get(IdempotencyMetrics).snapshot().claims).toEqual({
      [ORDERS_SCOPE]: { failed: 1, reclaimed: 1 },
    });
  });

  it('fails a duplicate job with EventInFlightError while the first is parked, then completes it as replayed', async () => {
    const prefix = newPrefix();
    const queue = openQueue(EXTERNAL_QUEUE, prefix);
    const app = await startWorkerApp(settingsFor(prefix, 'main', ['external']));
    const gates = app.get(Gates);
    const failures: { jobId: string | undefined; error: Error }[] = [];
    app.get(ExternalOrdersProcessor).worker.on('failed', (job, error) => {
      failures.push({ jobId: job?.id, error });
    });
    const eventId = 'evt_bull_in_flight';

    await queue.add('order', { eventId, parkIn: 'main' }, { jobId: 'holder' });
    await gates.entered(eventId);
    await queue.add('order', { eventId }, { ...RETRY, jobId: 'duplicate' });
    await waitUntil(() => failures.length > 0, 'the duplicate job to fail in flight', SETTLE_MS);

    const [first] = failures;
    expect(first.jobId).toBe('duplicate');
    expect(first.error).toBeInstanceOf(EventInFlightError);
    expect(first.error).toMatchObject({
      code: 'IDEMPOTENCY_IN_FLIGHT',
      scope: EXTERNAL_SCOPE,
      key: eventId,
      message: inFlight(eventId),
    });
    // The holder's lease has far more than retryAfterSeconds (30) left: the cap applies.
    expect((first.error as EventInFlightError).retryAfterSeconds).toBe(30);
    const waiting = (await queue.getJob('duplicate'))!;
    expect(waiting.failedReason).toBe(inFlight(eventId));
    expect(['delayed', 'waiting', 'active']).toContain(await queue.getJobState('duplicate'));
    expect(await downstreamCalls(db, eventId)).toEqual([]);

    gates.open(eventId);
    const holder = await settled(queue, 'holder');
    const duplicate = await settled(queue, 'duplicate');
    expect(await queue.getJobState('holder')).toBe('completed');
    expect(await queue.getJobState('duplicate')).toBe('completed');
    expect(holder.returnvalue).toEqual({ processed: eventId, worker: 'main', attempt: 1 });
    expect(duplicate.returnvalue).toBeNull();
    expect(duplicate.finishedOn!).toBeGreaterThanOrEqual(holder.finishedOn!);
    // Every failure was the duplicate answered in flight; its last attempt was the replay.
    expect(
      failures.every(({ jobId, error }) => jobId === 'duplicate' && error instanceof EventInFlightError),
    ).toBe(true);
    expect(duplicate.attemptsMade).toBe(failures.length + 1);
    expect(await downstreamCalls(db, eventId)).toEqual([{ attempt: 1 }]);
    expect(await claimRow(db, EXTERNAL_SCOPE, eventId)).toMatchObject({ status: 'done', attempts: 1 });
    expect(app.get(IdempotencyMetrics).snapshot().claims).toEqual({
      [EXTERNAL_SCOPE]: { claimed: 1, in_flight: failures.length, replayed: 1 },
    });
  });
});
