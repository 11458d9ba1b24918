import { resolve } from 'node:path';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { expireLease } from '../../lib/testing/index.js';
import {
  CALLER_HEADER,
  MODEL_QUEUE,
  MODEL_SCHEMA,
  SWITCH_HEADERS,
  type ModelDelivery,
  type ModelMode,
  type ModelSettings,
} from '../fixtures/model-webhooks.fixture.js';
import type { AdapterName } from './app.js';
import { startChildApp, type ChildApp } from './child-app.js';
import { CountingDownstream } from './counting-downstream.js';
import { createTestDatabase, lockWaiters, type TestDatabase } from './database.js';
import { startPostgres, type PostgresServer } from './postgres-server.js';
import { waitUntil, within } from './wait-until.js';

const CHILD_ENTRY = resolve('dist/test/fixtures/model-child.js');

/**
 * Long enough to outlast a database restart while a handler holds its lease (the heartbeat
 * fails while the server is down), so only a dead process's lease ever expires; those the test
 * ends with expireLease(), as the time a dead worker's lease takes to run out.
 */
const LEASE_MS = 20_000;
/** A duplicate in the same process waits this long for the first delivery, then 409. */
const DUPLICATE_WAIT_MS = 250;
/** A real API's latency, so a downstream call takes time as it would. */
const DOWNSTREAM_LATENCY_MS = 10;
/** Bounds every request, so a hung delivery fails the run naming it instead of hanging it. */
const REQUEST_TIMEOUT_MS = 30_000;
/** App processes serving at once, as replicas behind a load balancer. */
export const REPLICAS = 2;
/**
 * Bounds a replica's boot: the app with pg-boss takes seconds, and many more on a loaded machine;
 * a slow boot is no broken promise.
 */
const BOOT_TIMEOUT_MS = 120_000;
/** Bounds a handler's arrival at its gate. */
const GATE_TIMEOUT_MS = 20_000;
/** Bounds the wait, after the drain, for the jobs to settle and the callbacks to fire. */
const SETTLE_MS = 45_000;
/** pg-boss states of a job still to run. */
const PENDING_JOB_STATES = new Set(['created', 'retry', 'active']);

/** One release of the app: the platform and the mode the switchable scope is deployed with. */
export interface Release {
  adapter: AdapterName;
  switchMode: ModelMode;
}

/** What a delivery was answered, as the model judges it. */
export interface Answer {
  /** 0 when no answer came (the process died, the connection was cut). */
  status: number;
  replayed: boolean;
  /** An ordered event older than its entity's version: done without running (`Idempotent-Stale`). */
  stale?: boolean;
  retryAfter?: string;
  body: unknown;
  /** The transport error when status is 0. */
  error?: string;
}

/** A delivery parked at its gate in a running app (or answered before it got there). */
export interface Parking {
  /** False when the handler never reached its gate: the event was done already, or in flight. */
  parked: boolean;
  app: ModelApp;
  answer: Promise<Answer>;
  /** Lets the parked handler go on. */
  open(): void;
}

/** A running release of the model app (a child process). */
export interface ModelApp {
  release: Release;
  child: ChildApp;
  pid: number;
}

/** A request-mode delivery's request: its caller, its key and its body (ModelDelivery.request). */
export interface RequestSend {
  owner: string;
  key: string;
  contentType: string;
  /** The body's bytes, base64 (a delivery is JSON). */
  base64: string;
}

/** Everything the final comparison reads: effects, claims, jobs, the ordered entities. */
export interface Observed {
  effects: Map<string, EventEffects>;
  /** `scope key` → status. */
  claims: Map<string, string>;
  /** A job's effect id → the states of the pg-boss jobs that carry it. */
  jobs: Map<string, string[]>;
  /** Ordered entity → the version that stands. */
  entities: Map<string, number>;
  /** The ordered events applied, by the event id of their 'ord' row, in the order they were written. */
  applied: string[];
}

/** Effects of one event, as read from the database and the downstream. */
export interface EventEffects {
  rows: Record<string, number>;
  /** Downstream calls, with the pid of the process that made each. */
  calls: number[];
}

/**
 * Everything real the model test drives: a PostgreSQL server of its own (so it can restart it),
 * one database, the counting downstream, and two replicas of the app in child processes that the
 * test redeploys and SIGKILLs. Lives for the whole test file; each fast-check run uses fresh event ids.
 */
export class ModelSystem {
  /** The replicas deliveries go to, by slot: the same release, except inside a redeploy. */
  private readonly replicas: (ModelApp | undefined)[] = [];
  /** Every process started and not yet stopped (a redeploy's old replica included). */
  private readonly running = new Set<ModelApp>();
  private gates = 0;
  private halted = false;

  private constructor(
    private readonly server: PostgresServer,
    readonly db: TestDatabase,
    readonly downstream: CountingDownstream,
    /** A DataSource of the test's own, for lib/testing's expireLease(). */
    private readonly dataSource: DataSource,
  ) {}

  static async start(): Promise<ModelSystem> {
    const server = await startPostgres({ reuseDatabaseUrl: false });
    const db = await createTestDatabase(server.adminUrl);
    await db.pool.query(MODEL_SCHEMA);
    const downstream = await CountingDownstream.start({ latencyMs: DOWNSTREAM_LATENCY_MS });
    const dataSource = new DataSource({ type: 'postgres', url: db.url, extra: { max: 2 } });
    await dataSource.initialize();
    return new ModelSystem(server, db, downstream, dataSource);
  }

  /** The replica in `slot` (0 or 1). */
  replica(slot: number): ModelApp {
    const app = this.replicas[slot % REPLICAS];
    if (!app) throw new Error(`no model app runs in slot ${slot % REPLICAS}`);
    return app;
  }

  /** Starts a release in a new process, without routing anything to it yet. */
  async boot(release: Release): Promise<ModelApp> {
    const settings: ModelSettings = {
      databaseUrl: this.db.url,
      downstreamUrl: this.downstream.url,
      switchMode: release.switchMode,
      leaseMs: LEASE_MS,
      concurrentDuplicateWaitMs: DUPLICATE_WAIT_MS,
    };
    const child = await startChildApp(release.adapter, settings, {
      entry: CHILD_ENTRY,
      readyTimeoutMs: BOOT_TIMEOUT_MS,
    });
    const app = { release, child, pid: child.process.pid! };
    this.running.add(app);
    return app;
  }

  /** The slot `app` serves. */
  slotOf(app: ModelApp): number {
    const slot = this.replicas.indexOf(app);
    if (slot < 0) throw new Error(`pid ${app.pid} serves no slot`);
    return slot;
  }

  /** Routes the deliveries of `slot` to `app` from now on (the previous one is the caller's to stop). */
  route(slot: number, app: ModelApp): void {
    this.replicas[slot % REPLICAS] = app;
  }

  /** Makes `release` the one every replica runs, booting those that run another; the database is up. */
  async ensure(release: Release): Promise<void> {
    if (this.halted) await this.resumeDatabase();
    await Promise.all(
      Array.from({ length: REPLICAS }, async (_, slot) => {
        const running = this.replicas[slot];
        if (
          running &&
          running.release.adapter === release.adapter &&
          running.release.switchMode === release.switchMode
        )
          return;
        this.route(slot, await this.boot(release));
        if (running) await this.stop(running);
      }),
    );
  }

  /** SIGKILL: no shutdown hook runs; Postgres sees the connections die and rolls back. */
  async kill(app: ModelApp): Promise<void> {
    await app.child.kill();
    this.forget(app);
  }

  /** Stops an app with nothing parked in it. */
  async stop(app: ModelApp): Promise<void> {
    await app.child.stop();
    this.forget(app);
  }

  /** Kills every app and brings the database back: after a failed run, whatever it left parked. */
  async reset(): Promise<void> {
    await Promise.all([...this.running].map((app) => this.kill(app)));
    if (this.halted) await this.resumeDatabase();
  }

  /** One delivery to `path` of `app`. */
  async send(path: string, delivery: ModelDelivery, app: ModelApp): Promise<Answer> {
    return send(app.child.url, path, delivery);
  }

  /**
   * Sends a delivery that parks at `point` and resolves once its handler is there, or once it was
   * answered without getting there (the event was done, or in flight elsewhere).
   */
  async park(path: string, delivery: Omit<ModelDelivery, 'gate'>, app: ModelApp): Promise<Parking> {
    const gate = `${delivery.id}#${++this.gates}`;
    const answer = send(app.child.url, path, { ...delivery, gate });
    const parked = await within(
      Promise.race([app.child.entered(gate).then(() => true), answer.then(() => false)]),
      GATE_TIMEOUT_MS,
      `the delivery of ${delivery.id} to reach its gate`,
    );
    return { parked, app, answer, open: () => app.child.open(gate) };
  }

  /** Waits until `count` sessions wait on a row lock, or `settled` settles; bounded. */
  async lockedOrSettled(count: number, settled: Promise<unknown>): Promise<void> {
    let done = false;
    settled.then(
      () => (done = true),
      () => (done = true),
    );
    await waitUntil(
      async () => done || (await lockWaiters(this.db)) >= count,
      `${count} deliveries waiting on the claim's row lock`,
      GATE_TIMEOUT_MS,
      20,
    );
  }

  private forget(app: ModelApp): void {
    this.running.delete(app);
    const slot = this.replicas.indexOf(app);
    if (slot >= 0) this.replicas[slot] = undefined;
  }

  /** Ends an in-progress lease now (lib/testing): a dead worker's lease running out. */
  expireLease(scope: string, key: string): Promise<boolean> {
    return expireLease(this.dataSource, scope, key);
  }

  /** A fast shutdown of the server: sessions terminated, new ones refused. */
  async haltDatabase(): Promise<void> {
    this.halted = true;
    await this.server.halt();
  }

  async resumeDatabase(): Promise<void> {
    await this.server.resume();
    this.halted = false;
  }

  /** The effects of the events whose ids start with `prefix`, by event id. */
  async effects(prefix: string): Promise<Map<string, EventEffects>> {
    const effects = new Map<string, EventEffects>();
    const of = (id: string) => {
      let entry = effects.get(id);
      if (!entry) effects.set(id, (entry = { rows: {}, calls: [] }));
      return entry;
    };
    const { rows } = await this.db.pool.query<{ event_id: string; kind: string; n: string }>(
      `SELECT event_id, kind, count(*) AS n FROM model_effects WHERE starts_with(event_id, $1)
       GROUP BY event_id, kind`,
      [prefix],
    );
    for (const row of rows) of(row.event_id).rows[row.kind] = Number(row.n);
    for (const call of this.downstream.calls) {
      if (call.eventId.startsWith(prefix)) of(call.eventId).calls.push(call.callerPid ?? 0);
    }
    return effects;
  }

  /**
   * The claim rows whose keys hold `prefix` (a request-mode key follows its owner): `scope key` →
   * status.
   */
  async claims(prefix: string): Promise<Map<string, string>> {
    const { rows } = await this.db.pool.query<{ scope: string; event_key: string; status: string }>(
      'SELECT scope, event_key, status FROM processed_events WHERE strpos(event_key, $1) > 0',
      [prefix],
    );
    return new Map(rows.map((row) => [`${row.scope} ${row.event_key}`, row.status]));
  }

  /** The pg-boss jobs on MODEL_QUEUE of the run, by their effect id: their states. */
  async jobs(prefix: string): Promise<Map<string, string[]>> {
    const { rows } = await this.db.pool.query<{ job: string; state: string }>(
      `SELECT data->'data'->>'job' AS job, state::text AS state FROM pgboss.job
       WHERE name = $1 AND starts_with(data->'data'->>'job', $2) ORDER BY created_on`,
      [MODEL_QUEUE, prefix],
    );
    const jobs = new Map<string, string[]>();
    for (const row of rows) jobs.set(row.job, [...(jobs.get(row.job) ?? []), row.state]);
    return jobs;
  }

  /**
   * Waits until no job of the run waits or runs (a killed worker's job comes back once it
   * expires) and every callback in `callbacks` has fired; bounded, then the comparison says
   * what is missing.
   */
  async settle(prefix: string, callbacks: readonly string[]): Promise<void> {
    const deadline = performance.now() + SETTLE_MS;
    while (performance.now() < deadline) {
      const states = [...(await this.jobs(prefix)).values()].flat();
      const fired = new Set(this.downstream.calls.map((call) => call.eventId));
      if (!states.some((state) => PENDING_JOB_STATES.has(state)) && callbacks.every((id) => fired.has(id)))
        return;
      await new Promise((resume) => setTimeout(resume, 100));
    }
  }

  /** What the final comparison reads, for the run's `prefix`. */
  async observe(prefix: string): Promise<Observed> {
    const [effects, claims, jobs, entities, applied] = await Promise.all([
      this.effects(prefix),
      this.claims(prefix),
      this.jobs(prefix),
      this.db.pool.query<{ entity: string; version: number }>(
        'SELECT entity, version FROM model_entities WHERE starts_with(entity, $1)',
        [prefix],
      ),
      this.db.pool.query<{ event_id: string }>(
        `SELECT event_id FROM model_effects WHERE kind = 'ord' AND starts_with(event_id, $1) ORDER BY id`,
        [prefix],
      ),
    ]);
    return {
      effects,
      claims,
      jobs,
      entities: new Map(entities.rows.map((row) => [row.entity, row.version])),
      applied: applied.rows.map((row) => row.event_id),
    };
  }

  /**
   * Resolves with the replica whose process reached `gate` (a job's, which either may run), or
   * undefined when none did within the gate timeout.
   */
  async enteredAnywhere(gate: string): Promise<ModelApp | undefined> {
    const apps = Array.from({ length: REPLICAS }, (_, slot) => this.replica(slot));
    const timeout = new Promise<undefined>((resolve) =>
      setTimeout(() => resolve(undefined), GATE_TIMEOUT_MS).unref(),
    );
    return Promise.race([...apps.map((app) => app.child.entered(gate).then(() => app)), timeout]);
  }

  async close(): Promise<void> {
    await this.reset().catch(() => undefined);
    await this.dataSource.destroy().catch(() => undefined);
    await this.downstream.close();
    await this.db.drop().catch(() => undefined);
    await this.server.stop();
  }
}

async function send(url: string, path: string, delivery: ModelDelivery): Promise<Answer> {
  try {
    const sent = request(url).post(path);
    // The request-mode routes take their key from the header, as the draft writes it (quoted).
    if (path === '/req') sent.set('Idempotency-Key', `"${delivery.id}"`);
    let response;
    if (path === '/reqo' && delivery.request) {
      // The request is the body; the test's switches ride in headers.
      const { owner, key, contentType, base64 } = delivery.request;
      sent.set('Idempotency-Key', `"${key}"`).set(CALLER_HEADER, owner).set('content-type', contentType);
      if (delivery.gate)
        sent
          .set(SWITCH_HEADERS.gate, delivery.gate)
          .set(SWITCH_HEADERS.park, delivery.park ?? 'before-effect');
      if (delivery.fail) sent.set(SWITCH_HEADERS.fail, '1');
      if (delivery.status) sent.set(SWITCH_HEADERS.status, String(delivery.status));
      // superagent sends a Buffer's bytes only as such; JSON and text go as their text.
      const bytes = Buffer.from(base64, 'base64');
      const sentBody = contentType === 'application/octet-stream' ? bytes : bytes.toString();
      response = await sent.send(sentBody).timeout(REQUEST_TIMEOUT_MS);
    } else {
      response = await sent.send(delivery).timeout(REQUEST_TIMEOUT_MS);
    }
    return {
      status: response.status,
      replayed: response.headers['idempotent-replayed'] === 'true',
      stale: response.headers['idempotent-stale'] === 'true',
      retryAfter: response.headers['retry-after'],
      body: response.body,
    };
  } catch (error) {
    return {
      status: 0,
      replayed: false,
      body: undefined,
      error: error instanceof Error ? error.message : String(error),
    };
  }
}
