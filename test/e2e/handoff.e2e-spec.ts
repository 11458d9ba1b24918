import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Module, Scope } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { TypeOrmModule } from '@nestjs/typeorm';
import {
  ExpiredLeaseReporter,
  idempotencyEntities,
  IdempotencyModule,
  IdempotentWorker,
  type HandoffOptions,
} from '../../lib/index.js';
import { HandoffMetrics } from '../../lib/observability/index.js';
import { HandoffQueues } from '../../lib/operator/index.js';
import { QueueHandoff } from '../../lib/transports/queue/queue-handoff.js';
import {
  failedOnPurpose,
  HandoffFixtureModule,
  TX_QUEUE,
  TX_WORKER_SCOPE,
  WEBHOOK_SCOPE,
  type HandoffEvent,
  type HandoffSettings,
  type WorkerName,
} from '../fixtures/handoff.fixture.js';
import { Gates } from '../fixtures/webhook-fixture.module.js';
import { startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';
import { startPgBouncer } from '../support/pgbouncer.js';
import { waitUntil } from '../support/wait-until.js';

/** pg-boss's schema in this file: not the default, so the option is what puts it there. */
const SCHEMA = 'handoff_jobs';
/** Quick retries and polling, so the whole retry path runs in about a second. */
const HANDOFF: HandoffOptions = {
  schema: SCHEMA,
  pollingIntervalMs: 100,
  maintenanceIntervalSeconds: 1,
  drainMs: 5_000,
  queues: { [TX_QUEUE]: { retryLimit: 2, retryDelaySeconds: 0, retryBackoff: false, expireInSeconds: 30 } },
};

/**
 * The handoff in one process, on real Postgres and real pg-boss: the webhook's claim, its writes
 * and its job commit together or not at all; a worker runs each job once under its own claim;
 * retries run out into the dead-letter queue, which the reporter reports; shutdown drains.
 */
describe('handoff to a worker (pg-boss)', () => {
  let db: TestDatabase;
  const apps: RunningApp[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterEach(async () => {
    for (const running of apps.splice(0).reverse()) {
      running.app.get(Gates).openAll();
      await running.close();
    }
  });

  afterAll(async () => {
    await db.drop();
  });

  async function start(
    options: {
      web?: boolean;
      workers?: WorkerName[];
      handoff?: HandoffOptions;
      logs?: LogCapture;
      databaseUrl?: string;
    } = {},
  ): Promise<RunningApp> {
    const settings: HandoffSettings = {
      databaseUrl: options.databaseUrl ?? db.url,
      web: options.web ?? true,
      workers: options.workers ?? [],
      idempotency: { handoff: options.handoff ?? HANDOFF },
    };
    const running = await startApp('express', [HandoffFixtureModule.forSettings(settings)], {
      logger: options.logs ?? false,
    });
    apps.push(running);
    return running;
  }

  const post = (url: string, event: HandoffEvent) =>
    fetch(`${url}/webhook`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(event),
    });

  /** The event's jobs on `queue`, in every state. */
  const jobs = (queue: string, key: string) =>
    db.pool
      .query(
        `SELECT id, state, retry_count FROM ${SCHEMA}.job WHERE name = $1 AND data->'event'->>'key' = $2`,
        [queue, key],
      )
      .then((result) => result.rows as { id: string; state: string; retry_count: number }[]);
  const claimStatus = (scope: string, key: string) =>
    db.pool
      .query('SELECT status FROM processed_events WHERE scope = $1 AND event_key = $2', [scope, key])
      .then((result) => result.rows[0]?.status as string | undefined);
  const effects = (key: string) =>
    db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [key]);
  const orders = (key: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [key]);

  it('answers 200 once claim, order and job have committed together; the worker runs the job once', async () => {
    const web = await start({ web: true });
    // Quotes, a backslash, a placeholder, a comment and non-ASCII: the job is written with its
    // values inlined into the COMMIT's query, and must come back exactly.
    const note = `it's a "note" \\ $1 -- /* x */ ü 😀`;
    const response = await post(web.url, { id: 'evt_commit', job: { note } });
    expect(response.status).toBe(200);
    const body = (await response.json()) as { jobId: string };
    // Answered after the one COMMIT: everything is visible to another connection already.
    expect(await claimStatus(WEBHOOK_SCOPE, 'evt_commit')).toBe('done');
    expect(await orders('evt_commit')).toBe(1);
    const [job] = await jobs(TX_QUEUE, 'evt_commit');
    expect(job).toMatchObject({ id: body.jobId, state: 'created' });
    const { rows } = await db.pool.query(`SELECT data FROM ${SCHEMA}.job WHERE id = $1`, [body.jobId]);
    expect(rows[0].data).toEqual({
      event: { key: 'evt_commit', scope: WEBHOOK_SCOPE, source: 'fixture' },
      // The job's own key, by default its id: what the worker claims it under.
      key: body.jobId,
      data: { note },
    });

    const worker = await start({ web: false, workers: ['tx'] });
    await waitUntil(
      async () => (await jobs(TX_QUEUE, 'evt_commit'))[0]?.state === 'completed',
      'the job completed',
    );
    expect(await effects('evt_commit')).toBe(1);
    // The worker's claim is the job's (its key, by default its id), not the event's.
    expect(await claimStatus(TX_WORKER_SCOPE, body.jobId)).toBe('done');
    expect(await claimStatus(TX_WORKER_SCOPE, 'evt_commit')).toBeUndefined();
    // The worker's claim takes the enqueuing delivery's source.
    const source = await db.pool.query(
      'SELECT source FROM processed_events WHERE scope = $1 AND event_key = $2',
      [TX_WORKER_SCOPE, body.jobId],
    );
    expect(source.rows[0].source).toBe('fixture');
    // One transaction: now() is its start time, so the claim and the job's completion carry the same.
    const times = await db.pool.query(
      `SELECT (SELECT completed_at FROM processed_events WHERE scope = $1 AND event_key = $2) AS claimed,
              (SELECT completed_on FROM ${SCHEMA}.job WHERE id = $3) AS completed`,
      [TX_WORKER_SCOPE, body.jobId, body.jobId],
    );
    expect(times.rows[0].completed).toEqual(times.rows[0].claimed);
    // And the webhook's claim and its job were written by one transaction too.
    const written = await db.pool.query(
      `SELECT (SELECT completed_at FROM processed_events WHERE scope = $1 AND event_key = $2) AS claimed,
              (SELECT created_on FROM ${SCHEMA}.job WHERE id = $3) AS created`,
      [WEBHOOK_SCOPE, 'evt_commit', body.jobId],
    );
    expect(written.rows[0].created).toEqual(written.rows[0].claimed);
    expect(worker.app.get(HandoffMetrics).snapshot().jobs[TX_QUEUE]).toEqual({ completed: 1 });
  });

  it('rolls back claim, order and job together when the handler fails after its enqueue; the redelivery enqueues once', async () => {
    const web = await start({ web: true });
    expect((await post(web.url, { id: 'evt_rollback', fail: true })).status).toBe(500);
    expect(await claimStatus(WEBHOOK_SCOPE, 'evt_rollback')).not.toBe('done');
    expect(await orders('evt_rollback')).toBe(0);
    expect(await jobs(TX_QUEUE, 'evt_rollback')).toEqual([]);

    expect((await post(web.url, { id: 'evt_rollback' })).status).toBe(200);
    expect(await jobs(TX_QUEUE, 'evt_rollback')).toHaveLength(1);
    expect(await orders('evt_rollback')).toBe(1);
  });

  it('replays duplicates while the job waits, with one job; the worker then runs it once', async () => {
    const web = await start({ web: true });
    const first = await post(web.url, { id: 'evt_dup' });
    expect(first.status).toBe(200);
    for (let i = 0; i < 3; i++) {
      const again = await post(web.url, { id: 'evt_dup' });
      expect(again.status).toBe(200);
      expect(again.headers.get('idempotent-replayed')).toBe('true');
    }
    const waiting = await jobs(TX_QUEUE, 'evt_dup');
    expect(waiting).toHaveLength(1);
    expect(waiting[0].state).toBe('created');
    expect((await web.app.get(HandoffQueues).stats())[TX_QUEUE].queued).toBeGreaterThanOrEqual(1);

    await start({ web: false, workers: ['tx'] });
    await waitUntil(
      async () => (await jobs(TX_QUEUE, 'evt_dup'))[0]?.state === 'completed',
      'the job completed',
    );
    expect(await effects('evt_dup')).toBe(1);
    expect(await orders('evt_dup')).toBe(1);
  });

  it('fails a delivery whose queue does not exist, writing nothing', async () => {
    const web = await start({ web: true });
    expect((await post(web.url, { id: 'evt_noqueue', queue: 'no-such-queue' })).status).toBe(500);
    expect(await claimStatus(WEBHOOK_SCOPE, 'evt_noqueue')).toBe('failed');
    expect(await orders('evt_noqueue')).toBe(0);
    // The failure is the handler's, recorded with the reason.
    const { rows } = await db.pool.query(
      'SELECT last_error FROM processed_events WHERE scope = $1 AND event_key = $2',
      [WEBHOOK_SCOPE, 'evt_noqueue'],
    );
    expect(rows[0].last_error).toContain(
      'No job was written to queue no-such-queue: pg-boss has no such queue',
    );
  });

  it('refuses enqueue() in an external-mode handler: no job, the lease is released', async () => {
    const web = await start({ web: true });
    const response = await fetch(`${web.url}/webhook/external`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id: 'evt_external' }),
    });
    expect(response.status).toBe(500);
    expect(await claimStatus('HandoffController.external', 'evt_external')).toBe('failed');
    expect(
      await db.count(`SELECT count(*) FROM ${SCHEMA}.job WHERE data->'event'->>'key' = 'evt_external'`),
    ).toBe(0);
  });

  it('retries a failing job with pg-boss, then dead-letters it; the reporter reports it and the metrics count it', async () => {
    const logs = new LogCapture();
    const web = await start({ web: true, workers: ['tx'], logs });
    expect((await post(web.url, { id: 'evt_poison', job: { failAttempts: 1e9 } })).status).toBe(200);
    const deadLetter = `${TX_QUEUE}.dead-letter`;
    await waitUntil(async () => (await jobs(deadLetter, 'evt_poison')).length === 1, 'the dead-lettered job');
    const [failed] = await jobs(TX_QUEUE, 'evt_poison');
    // retryLimit 2: three attempts, each rolled back, so no effect survives.
    expect(failed).toMatchObject({ state: 'failed', retry_count: 2 });
    expect(await effects('evt_poison')).toBe(0);
    expect(logs.find('warn', failedOnPurpose(1), 'pg-boss retries it')).toHaveLength(1);
    expect(logs.find('error', failedOnPurpose(3), 'dead-letter')).toHaveLength(1);

    const report = await web.app.get(ExpiredLeaseReporter).run();
    expect(report.deadLettered).toEqual([
      expect.objectContaining({
        queue: TX_QUEUE,
        deadLetter,
        event: { key: 'evt_poison', scope: WEBHOOK_SCOPE, source: 'fixture' },
        lastError: failedOnPurpose(3),
      }),
    ]);
    expect(logs.find('error', 'dead-lettered job', TX_QUEUE, 'evt_poison', deadLetter)).toHaveLength(1);
    const snapshot = web.app.get(HandoffMetrics).snapshot();
    expect(snapshot.jobs[TX_QUEUE]).toEqual({ failed: 3, retried: 2, dead_lettered: 1 });
    expect(snapshot.queues[TX_QUEUE]).toMatchObject({ failed: 1, deadLettered: 1, active: 0 });
    // The worker's claim (the job's) recorded each failure, as any transaction-mode failure is.
    const { rows } = await db.pool.query(
      'SELECT status, attempts FROM processed_events WHERE scope = $1 AND event_key = $2',
      [TX_WORKER_SCOPE, failed.id],
    );
    expect(rows[0]).toEqual({ status: 'failed', attempts: 3 });
  });

  it.each([['auto' as const], [true]])(
    'behind a transaction-mode pooler (preparedStatements %s), every delivery commits its job once: prepared-state misses are retried',
    async (preparedStatements) => {
      const bouncer = await startPgBouncer(db.url, { poolSize: 3 });
      try {
        const logs = new LogCapture();
        const settings: HandoffSettings = {
          databaseUrl: bouncer.urlFor(db.url),
          web: true,
          poolSize: 8,
          idempotency: { handoff: HANDOFF, preparedStatements },
        };
        const web = await startApp('express', [HandoffFixtureModule.forSettings(settings)], { logger: logs });
        apps.push(web);
        const keys = Array.from({ length: 24 }, (_, i) => `evt_pooled_${preparedStatements}_${i}`);
        // As a sender would: a 5xx is retried, a bounded number of times.
        const deliver = async (id: string) => {
          for (let attempt = 1; attempt <= 5; attempt++) {
            const response = await post(web.url, { id });
            if (response.status === 200) return attempt;
          }
          throw new Error(`${id} was never accepted`);
        };
        await Promise.all(keys.map(deliver));
        for (const key of keys) {
          expect([key, (await jobs(TX_QUEUE, key)).length]).toEqual([key, 1]);
          expect(await claimStatus(WEBHOOK_SCOPE, key)).toBe('done');
        }
        const replay = await post(web.url, { id: keys[0] });
        expect(replay.headers.get('idempotent-replayed')).toBe('true');
        expect(await jobs(TX_QUEUE, keys[0])).toHaveLength(1);
      } finally {
        for (const running of apps.splice(0)) await running.close();
        await bouncer.stop();
      }
    },
  );

  it('boots while another instance creates the same pg-boss schema at that moment', async () => {
    // Replicas booting at once on a fresh database: the other's CREATE SCHEMA is not committed
    // yet, so this one's install waits on the catalog's unique index and then fails there
    // (23505 on pg_namespace_nspname_index) once it commits. The next start finds the schema.
    const schema = 'handoff_race';
    const holder = await db.pool.connect();
    const logs = new LogCapture();
    let starting: Promise<RunningApp> | undefined;
    try {
      await holder.query('BEGIN');
      await holder.query(`CREATE SCHEMA ${schema}`);
      starting = start({ web: false, workers: ['tx'], handoff: { ...HANDOFF, schema }, logs });
      starting.catch(() => undefined);
      await waitUntil(
        async () =>
          (await db.count(
            `SELECT count(*) FROM pg_stat_activity
             WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%CREATE SCHEMA IF NOT EXISTS ${schema}%'`,
            [db.name],
          )) === 1,
        "the app's pg-boss install to wait on the uncommitted schema",
      );
    } finally {
      await holder.query('COMMIT');
      holder.release();
    }
    await starting;

    expect(logs.find('warn', `installing schema ${schema} at the same moment`)).toHaveLength(1);
    expect(await db.count(`SELECT count(*) FROM ${schema}.version`)).toBe(1);
    expect(await db.count(`SELECT count(*) FROM ${schema}.queue WHERE name = $1`, [TX_QUEUE])).toBe(1);
  });

  it('boots while another instance creates the same queue at that moment, though create_queue deadlocks', async () => {
    const schema = 'handoff_queue_race';
    // pg-boss installed in a schema of its own, without the file's queues.
    const installer = await start({ web: false, handoff: { ...HANDOFF, schema, queues: {} } });
    apps.splice(apps.indexOf(installer), 1);
    await installer.close();

    // Two replicas creating queues at once deadlock inside create_queue(): each has inserted its
    // queue row (ROW EXCLUSIVE on the queue table) and waits to add its partition's foreign keys.
    // Made here on purpose, with the other replica played by a session of the test's: it holds
    // the job table, which the app's create_queue needs once its row is inserted, and then asks
    // for the queue table. Waiting for each other on two tables, one is rolled back: the app, whose
    // deadlock check comes first (40P01). It waits first, and PostgreSQL checks a wait once, after
    // deadlock_timeout, so the app's is 5 s (the holder asks within that, even on a loaded machine)
    // and the holder's 30 s. Both settings need a superuser, which the test server's user is.
    const deadLetter = `${TX_QUEUE}.dead-letter`;
    const appUrl = new URL(db.url);
    appUrl.searchParams.set('options', '-c deadlock_timeout=5s');
    const databaseUrl = appUrl.toString();
    const holder = await db.pool.connect();
    const logs = new LogCapture();
    let starting: Promise<RunningApp> | undefined;
    try {
      await holder.query('BEGIN');
      await holder.query(`SET LOCAL deadlock_timeout = '30s'`);
      await holder.query(`LOCK TABLE ${schema}.job IN ACCESS EXCLUSIVE MODE`);
      starting = start({ web: false, workers: ['tx'], handoff: { ...HANDOFF, schema }, logs, databaseUrl });
      starting.catch(() => undefined);
      await waitUntil(
        async () =>
          (await db.count(
            `SELECT count(*) FROM pg_stat_activity
             WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%create_queue%'`,
            [db.name],
          )) === 1,
        "the app's create_queue to wait for the job table",
        15_000,
        10,
      );
      await holder.query(`LOCK TABLE ${schema}.queue IN SHARE ROW EXCLUSIVE MODE`);
    } finally {
      await holder.query('COMMIT');
      holder.release();
    }
    await starting;

    expect(logs.find('warn', `creating queue ${deadLetter}`, 'deadlock detected')).toHaveLength(1);
    expect(
      await db.count(`SELECT count(*) FROM ${schema}.queue WHERE name = ANY ($1)`, [[TX_QUEUE, deadLetter]]),
    ).toBe(2);
  });

  it('drains on shutdown: a running job finishes within drainMs and is completed', async () => {
    const web = await start({ web: true });
    await post(web.url, { id: 'evt_drain', job: { parkIn: '*' } });
    const worker = await start({ web: false, workers: ['tx'] });
    const gates = worker.app.get(Gates);
    await gates.entered('evt_drain');
    let closed = false;
    const closing = worker.app.close().then(() => (closed = true));
    apps.splice(apps.indexOf(worker), 1);
    // The close waits for the parked job: a bounded look that it has not finished without it.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(closed).toBe(false);
    expect((await jobs(TX_QUEUE, 'evt_drain'))[0].state).toBe('active');
    gates.open('evt_drain');
    await closing;
    expect((await jobs(TX_QUEUE, 'evt_drain'))[0].state).toBe('completed');
    expect(await effects('evt_drain')).toBe(1);
  });

  it('stops waiting after drainMs, leaving the running job for pg-boss to hand out again', async () => {
    const web = await start({ web: true });
    await post(web.url, { id: 'evt_slow', job: { parkIn: '*' } });
    const logs = new LogCapture();
    const worker = await start({ web: false, workers: ['tx'], handoff: { ...HANDOFF, drainMs: 300 }, logs });
    const gates = worker.app.get(Gates);
    await gates.entered('evt_slow');
    const started = Date.now();
    const stopped = worker.app.get(QueueHandoff).onModuleDestroy();
    await stopped;
    // It did not wait for the parked job, which never ends until the test opens its gate.
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(logs.find('warn', '1 job(s) still running', '300 ms')).toHaveLength(1);
    expect((await jobs(TX_QUEUE, 'evt_slow'))[0].state).toBe('active');
    gates.open('evt_slow');
  });
});

/** A worker the boot must refuse, on a controller. */
@Controller()
class WorkerController {
  @IdempotentWorker(TX_QUEUE)
  run() {}
}

/** A request-scoped worker: no one instance to run its jobs. */
@Injectable({ scope: Scope.REQUEST })
class RequestScopedWorker {
  @IdempotentWorker(TX_QUEUE)
  run() {}
}

/** A plain worker, for the boot without the handoff option. */
@Injectable()
class PlainWorker {
  @IdempotentWorker(TX_QUEUE)
  run() {}
}

describe('handoff boot checks', () => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterAll(async () => {
    await db.drop();
  });

  async function boot(metadata: { controllers?: any[]; providers?: any[] }, handoff?: HandoffOptions) {
    @Module({
      imports: [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: db.url,
          entities: [...idempotencyEntities()],
          retryAttempts: 0,
        }),
        IdempotencyModule.forRoot({ prometheus: false, reporter: false, handoff }),
      ],
      ...metadata,
    })
    class AppModule {}
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    try {
      await app.init();
    } finally {
      await app.close().catch(() => undefined);
    }
  }

  it('refuses a worker when the module has no handoff option', async () => {
    await expect(boot({ providers: [PlainWorker] })).rejects.toThrow(
      '@IdempotentWorker on PlainWorker.run needs the handoff option',
    );
  });

  it('refuses a worker on a controller, and a request-scoped one', async () => {
    await expect(
      boot({ controllers: [WorkerController], providers: [RequestScopedWorker] }, HANDOFF),
    ).rejects.toThrow(
      /WorkerController\.run: a controller[\s\S]*RequestScopedWorker\.run: the provider RequestScopedWorker is request-scoped/,
    );
  });

  it('starts without pg-boss being touched when there is no handoff option', async () => {
    await boot({});
    expect(await db.count(`SELECT count(*) FROM pg_namespace WHERE nspname = 'pgboss'`)).toBe(0);
  });
});
