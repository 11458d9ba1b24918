import { randomUUID } from 'node:crypto';
import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
  type OnModuleInit,
} from '@nestjs/common';
import { DiscoveryService, MetadataScanner } from '@nestjs/core';
import type { InstanceWrapper } from '@nestjs/core/injector/instance-wrapper.js';
import type { DataSource } from 'typeorm';
import type { SqlExecutor } from '../../core/claim-strategy.js';
import type { IdempotentDelivery } from '../../core/idempotency-context.js';
import { IdempotencyService } from '../../core/idempotency.service.js';
import type { JobEnqueuer } from '../../core/job-enqueuer.js';
import {
  IDEMPOTENCY_CONFIG,
  IDEMPOTENCY_DATA_SOURCE,
  IDEMPOTENT_METHOD_METADATA,
  IDEMPOTENT_WEBHOOK_METADATA,
} from '../../idempotency.constants.js';
import {
  deadLetteredJob,
  drainTimedOut,
  enqueueBadOption,
  enqueueBadQueue,
  enqueueNeedsTransaction,
  handoffNotConfigured,
  handoffNotStarted,
  moreDeadLetteredJobs,
  pgBossFailed,
  pgBossInstallRaced,
  queueCreationRaced,
  pgBossSendChanged,
  queueMissing,
  unprotectedHandlers,
  workerAlsoIdempotent,
  workerNotStatic,
  workerOnController,
  workersWithoutHandoff,
} from '../../idempotency.messages.js';
import type {
  DeadLetteredJob,
  EnqueueOptions,
  HandedOffEvent,
  IdempotencyConfig,
  QueueStats,
} from '../../interfaces/index.js';
import { isCatalogRace, isRetryable } from '../../postgres/pg-errors.js';
import { poolExecutor } from '../../postgres/pool-executor.js';
import { queueStatements, type QueueStatements } from '../../postgres/queue.sql.js';
import {
  isQueueName,
  resolveHandoffOptions,
  resolveQueueSettings,
  type HandoffConfig,
  type QueueSettings,
} from './handoff-options.js';
import { HandoffMetrics } from './handoff-metrics.js';
import { handoffPayload, readHandoffPayload } from './handoff-payload.js';
import { IDEMPOTENT_WORKER_METADATA, type IdempotentWorkerMetadata } from './idempotent-worker.decorator.js';
import { loadPgBoss, type PgBoss, type PgBossConstructor } from './pg-boss.js';
import { WorkerLoop, type WorkerRegistration } from './worker-loop.js';

/** Tries of pg-boss's start, and of each queue's creation, when another replica does the same at that moment. */
const INSTALL_ATTEMPTS = 3;
/**
 * A pause of 50-250 ms before trying again after a race with another replica: replicas that
 * booted together would otherwise meet again at once.
 */
const raceBackoff = () => new Promise<void>((resolve) => setTimeout(resolve, 50 + Math.random() * 200));

/** Dead-lettered jobs logged per report; the rest is counted in one line. */
const MAX_LOGGED_DEAD_LETTERS = 50;
/** Dead-lettered jobs a report returns. */
const MAX_REPORTED_DEAD_LETTERS = 100;

/**
 * The handoff to workers, on pg-boss (an optional peer, loaded only with the `handoff` option).
 * At boot it finds the `@IdempotentWorker` methods (refusing those it cannot run), starts pg-boss
 * on the DataSource's pool in its own schema, and creates the queues and their dead-letter
 * queues. Once the app has started it runs a WorkerLoop per worker; on shutdown it stops them,
 * gives running jobs `drainMs`, and stops pg-boss. Several app instances share the queues:
 * pg-boss hands each job to one fetch at a time (SKIP LOCKED), and its maintenance runs on one
 * instance per interval.
 */
@Injectable()
export class QueueHandoff implements JobEnqueuer, OnModuleInit, OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger('IdempotencyHandoff');
  private readonly handoff?: HandoffConfig;
  private readonly statements?: QueueStatements;
  private readonly db: SqlExecutor;
  private boss?: PgBoss;
  private workers: WorkerRegistration[] = [];
  private loops: WorkerLoop[] = [];
  /** Every queue created at boot → its settings. */
  private readonly queues = new Map<string, QueueSettings>();
  private stopped = false;

  constructor(
    @Inject(IDEMPOTENCY_CONFIG) config: IdempotencyConfig,
    @Inject(IDEMPOTENCY_DATA_SOURCE) dataSource: DataSource,
    private readonly service: IdempotencyService,
    private readonly metrics: HandoffMetrics,
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
  ) {
    this.db = poolExecutor(dataSource);
    if (config.handoff !== undefined) {
      // Already checked with the other options, so no suggestions are needed here.
      this.handoff = resolveHandoffOptions(config.handoff, () => undefined);
      this.statements = queueStatements(this.handoff.schema);
    }
  }

  /** True when the module has a `handoff` option. */
  get enabled(): boolean {
    return this.handoff !== undefined;
  }

  /**
   * Fails the boot, before the app serves anything, for a worker that could not run, and for a
   * `handoff` that cannot start (pg-boss missing, its schema not creatable, a queue refused).
   */
  async onModuleInit(): Promise<void> {
    this.workers = this.findWorkers();
    if (!this.handoff) {
      if (this.workers.length > 0) throw new Error(workersWithoutHandoff(this.workers.map((w) => w.where)));
      return;
    }
    for (const [name, settings] of this.handoff.queues) this.queues.set(name, settings);
    for (const worker of this.workers) {
      if (!this.queues.has(worker.queue)) {
        this.queues.set(
          worker.queue,
          resolveQueueSettings(worker.queue, undefined, () => undefined),
        );
      }
    }
    const boss = await this.startPgBoss(this.handoff, await loadPgBoss());
    try {
      await this.createQueues(boss);
    } catch (error) {
      // A failed boot must not leave pg-boss's maintenance timer running.
      await boss.stop({ graceful: false, close: false, wait: true }).catch(() => undefined);
      throw error;
    }
    this.boss = boss;
  }

  /**
   * Starts pg-boss, installing or migrating its schema. Replicas booting at once on a fresh
   * database race on that install: pg-boss serializes it with an advisory lock, but the session
   * that waited can still fail on PostgreSQL's catalog (`CREATE SCHEMA IF NOT EXISTS` meets the
   * schema the other just committed as a unique violation), which pg-boss does not treat as the
   * race it is. The next attempt finds the schema installed. A failed start leaves the instance
   * marked as starting, so each attempt takes a new one.
   */
  private async startPgBoss(handoff: HandoffConfig, PgBoss: PgBossConstructor): Promise<PgBoss> {
    for (let attempt = 1; ; attempt++) {
      const boss = new PgBoss({
        db: this.db,
        schema: handoff.schema,
        migrate: true,
        supervise: true,
        // No cron: the handoff schedules nothing, and pg-boss's timekeeper would add a queue and a worker.
        schedule: false,
        maintenanceIntervalSeconds: handoff.maintenanceIntervalSeconds,
      });
      // An EventEmitter 'error' without a listener would throw from pg-boss's timers.
      boss.on('error', (error) => this.logger.error(pgBossFailed(error)));
      try {
        await boss.start();
        return boss;
      } catch (error) {
        if (attempt >= INSTALL_ATTEMPTS || !isCatalogRace(error)) throw error;
        this.logger.warn(pgBossInstallRaced(handoff.schema, error));
        // Nothing to stop: only the install can have failed, and pg-boss starts its timers after it.
        await raceBackoff();
      }
    }
  }

  /**
   * Dead-letter queues first (a queue's dead_letter references an existing queue), then the queues.
   * Replicas booting at once create the same queues at once, and pg-boss's create_queue() can
   * deadlock with itself: one inserts the queue row and then adds its partition's foreign keys
   * (a lock on the queue table), while the other's insert waits on that row holding a lock the
   * first needs. PostgreSQL rolls one back (40P01); run again, it finds the queue made.
   */
  private async createQueues(boss: PgBoss): Promise<void> {
    const deadLetters = new Set([...this.queues.values()].map((settings) => settings.deadLetter));
    for (const name of deadLetters) {
      if (!this.queues.has(name)) await this.againIfRaced(name, () => boss.createQueue(name, {}));
    }
    for (const [name, settings] of this.queues) {
      const options = {
        retryLimit: settings.retryLimit,
        retryDelay: settings.retryDelaySeconds,
        retryBackoff: settings.retryBackoff,
        expireInSeconds: settings.expireInSeconds,
        deadLetter: settings.deadLetter,
      };
      await this.againIfRaced(name, () => boss.createQueue(name, options));
      // createQueue leaves an existing queue as it was: this boot's settings apply from now on.
      await this.againIfRaced(name, () => boss.updateQueue(name, options));
    }
  }

  /** `step`, run again (up to INSTALL_ATTEMPTS in all) when it lost a race with another replica. */
  private async againIfRaced(queue: string, step: () => Promise<void>): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await step();
      } catch (error) {
        if (attempt >= INSTALL_ATTEMPTS || !(isRetryable(error) || isCatalogRace(error))) throw error;
        this.logger.warn(queueCreationRaced(queue, error));
        await raceBackoff();
      }
    }
  }

  /** Workers start once the whole app has: a job must not run against half-initialized providers. */
  onApplicationBootstrap(): void {
    if (!this.boss || !this.handoff) return;
    const deps = {
      boss: this.boss,
      service: this.service,
      metrics: this.metrics,
      logger: this.logger,
      pollingIntervalMs: this.handoff.pollingIntervalMs,
    };
    this.loops = this.workers.map((worker) => new WorkerLoop(worker, deps));
    for (const loop of this.loops) loop.start();
  }

  /**
   * Stops fetching, gives running jobs `drainMs` to finish, then stops pg-boss (its pool is the
   * DataSource's, which TypeORM closes afterwards). A job still running is left active: pg-boss
   * hands it out again once it expires, and its claim keeps it to one effect.
   */
  async onModuleDestroy(): Promise<void> {
    if (!this.boss || this.stopped || !this.handoff) return;
    this.stopped = true;
    const left = await Promise.all(this.loops.map((loop) => loop.stop(this.handoff!.drainMs)));
    const running = left.reduce((sum, count) => sum + count, 0);
    if (running > 0) this.logger.warn(drainTimedOut(running, this.handoff.drainMs));
    try {
      await this.boss.stop({ graceful: false, close: false, wait: true });
    } catch (error) {
      this.logger.error(pgBossFailed(error));
    }
  }

  /** See IdempotencyContext.enqueue(). */
  async enqueue(
    delivery: IdempotentDelivery,
    queue: string,
    data: unknown,
    options: EnqueueOptions = {},
  ): Promise<string> {
    if (!this.handoff) throw new Error(handoffNotConfigured('IdempotencyContext.enqueue()'));
    if (!delivery.executor) throw new Error(enqueueNeedsTransaction(delivery.scope));
    if (!isQueueName(queue)) throw new Error(enqueueBadQueue(queue));
    const { startAfterSeconds, priority } = options ?? {};
    if (startAfterSeconds !== undefined && !(Number.isInteger(startAfterSeconds) && startAfterSeconds >= 0)) {
      throw new Error(enqueueBadOption('startAfterSeconds', 'a whole number of seconds', startAfterSeconds));
    }
    if (priority !== undefined && !Number.isInteger(priority)) {
      throw new Error(enqueueBadOption('priority', 'a whole number', priority));
    }
    // Still accepted while shutting down: the job goes through the delivery's own transaction, so
    // a delivery in flight during the drain commits its job as at any other time.
    if (!this.boss) throw new Error(handoffNotStarted(queue));
    const event: HandedOffEvent = { key: delivery.key, scope: delivery.scope, source: delivery.source };
    const executor = delivery.executor;
    // pg-boss builds its insert as always, through a `db` that hands it to the claim transaction
    // to send with the COMMIT: the job costs the delivery no round trip of its own. The id is
    // chosen here, so that it is known before the insert runs.
    const id = randomUUID();
    let written = 0;
    const withCommit: SqlExecutor = {
      executeSql: (text, values = []) => {
        written++;
        // pg-boss writes nothing, silently, for a queue it does not have: the COMMIT fails instead.
        executor.beforeCommit(text, values, queueMissing(queue));
        return Promise.resolve({ rows: [{ id }], rowCount: 1 });
      },
    };
    const sent = await this.boss.send(queue, handoffPayload(event, data), {
      db: withCommit,
      id,
      ...(startAfterSeconds ? { startAfter: startAfterSeconds } : {}),
      ...(priority !== undefined ? { priority } : {}),
    });
    if (written !== 1 || sent !== id) throw new Error(pgBossSendChanged(written, sent, id));
    return id;
  }

  /**
   * Each queue created at boot, as the database has it now (jobs by state, its dead-letter
   * queue's waiting jobs, the oldest waiting job's age), also recorded in HandoffMetrics.
   */
  async stats(): Promise<Record<string, QueueStats>> {
    if (!this.statements) return {};
    const names = [...this.queues.keys()];
    const deadLetters = [...this.queues.values()].map((settings) => settings.deadLetter);
    const { rows } = await this.db.executeSql(this.statements.stats, [
      [...new Set([...names, ...deadLetters])],
    ]);
    const byName = new Map(rows.map((row) => [row.name as string, row]));
    const result: Record<string, QueueStats> = {};
    for (const [name, settings] of this.queues) {
      const row = byName.get(name);
      const dead = byName.get(settings.deadLetter);
      const stats: QueueStats = {
        queued: Number(row?.queued ?? 0),
        retrying: Number(row?.retrying ?? 0),
        active: Number(row?.active ?? 0),
        failed: Number(row?.failed ?? 0),
        deadLettered: Number(dead?.queued ?? 0) + Number(dead?.retrying ?? 0),
        oldestWaitingMs: Math.round(Number(row?.oldest_waiting_ms ?? 0)),
      };
      this.metrics.setQueueStats(name, stats);
      result[name] = stats;
    }
    return result;
  }

  /**
   * The expired-lease reporter's part for the handoff: refreshes the queue figures and, when
   * `log`, logs the jobs waiting in dead-letter queues (as poison events are, every report, until
   * someone deals with them). Resolves with those jobs, at most 100.
   */
  async report(log: boolean): Promise<DeadLetteredJob[]> {
    if (!this.statements) return [];
    await this.stats();
    if (!log) return [];
    const queuesOf = new Map<string, string[]>();
    for (const [name, settings] of this.queues) {
      queuesOf.set(settings.deadLetter, [...(queuesOf.get(settings.deadLetter) ?? []), name]);
    }
    const { rows } = await this.db.executeSql(this.statements.deadLettered, [
      [...queuesOf.keys()],
      MAX_REPORTED_DEAD_LETTERS,
    ]);
    const jobs = rows.map((row): DeadLetteredJob => {
      const payload = readHandoffPayload(row.data);
      const output = row.output as { message?: unknown } | null;
      return {
        queue: (queuesOf.get(row.name) ?? [row.name]).join(', '),
        deadLetter: row.name,
        id: row.id,
        event: payload?.event ?? null,
        data: payload ? payload.data : row.data,
        lastError: typeof output?.message === 'string' ? output.message : null,
        createdAt: new Date(row.created_on),
      };
    });
    for (const job of jobs.slice(0, MAX_LOGGED_DEAD_LETTERS)) {
      this.logger.error(deadLetteredJob(job.queue, job.deadLetter, job.event?.key ?? job.id, job.lastError));
    }
    if (jobs.length > MAX_LOGGED_DEAD_LETTERS) {
      this.logger.error(moreDeadLetteredJobs(jobs.length - MAX_LOGGED_DEAD_LETTERS));
    }
    return jobs;
  }

  /** Every `@IdempotentWorker` method, or the boot's refusal naming each one that cannot run. */
  private findWorkers(): WorkerRegistration[] {
    const problems: string[] = [];
    const workers: WorkerRegistration[] = [];
    for (const wrapper of this.discovery.getControllers()) {
      for (const { where } of this.workerMethods(wrapper)) problems.push(workerOnController(where));
    }
    for (const wrapper of this.discovery.getProviders()) {
      for (const { where, name, method, metadata } of this.workerMethods(wrapper)) {
        const instance = wrapper.instance as Record<string, unknown> | undefined;
        if (!wrapper.isDependencyTreeStatic() || wrapper.isTransient || !instance) {
          problems.push(workerNotStatic(where, String(wrapper.name)));
        } else if (
          Reflect.hasMetadata(IDEMPOTENT_METHOD_METADATA, method) ||
          Reflect.hasMetadata(IDEMPOTENT_WEBHOOK_METADATA, method)
        ) {
          problems.push(workerAlsoIdempotent(where));
        } else {
          const bound = instance[name] as (job: unknown) => unknown;
          workers.push({ ...metadata, where, call: (job) => bound.call(instance, job) });
        }
      }
    }
    if (problems.length > 0) throw new Error(unprotectedHandlers(problems));
    return workers;
  }

  private *workerMethods(wrapper: InstanceWrapper) {
    const instance = wrapper.instance as object | undefined;
    // useValue and useFactory providers have only their instance's class.
    const type = (instance && typeof instance === 'object' ? instance.constructor : wrapper.metatype) as
      (new (...args: any[]) => unknown) | undefined;
    const prototype = typeof type === 'function' ? (type.prototype as Record<string, unknown>) : undefined;
    if (!prototype) return;
    for (const name of this.scanner.getAllMethodNames(prototype)) {
      const method = prototype[name];
      if (typeof method !== 'function') continue;
      const metadata = Reflect.getMetadata(IDEMPOTENT_WORKER_METADATA, method) as
        IdempotentWorkerMetadata | undefined;
      if (metadata) yield { where: `${type!.name}.${name}`, name, method, metadata };
    }
  }
}
