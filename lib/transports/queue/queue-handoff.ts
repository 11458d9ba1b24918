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
import type { DataSource } from 'typeorm';
import { ClaimRunner } from '../../core/claim-runner.js';
import type { SqlExecutor } from '../../core/claim-strategy.js';
import { checkIdempotencyKey } from '../../core/idempotency-key.js';
import type { IdempotentDelivery } from '../../core/idempotency-context.js';
import type { JobEnqueuer } from '../../core/job-enqueuer.js';
import { IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE } from '../../idempotency.constants.js';
import { InvalidIdempotencyKeyError } from '../../idempotency.errors.js';
import { handoffNotConfigured, pgBossFailed } from '../../idempotency.messages.js';
import type { EnqueueOptions, HandedOffEvent, IdempotencyConfig } from '../../interfaces/index.js';
import { DeliveryTelemetry } from '../../observability/delivery-telemetry.js';
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
import { handoffPayload } from './handoff-payload.js';
import { loadPgBoss, type PgBoss } from './pg-boss.js';
import { startHandoffQueues } from './pg-boss-startup.js';
import { findWorkers } from './worker.explorer.js';
import { WorkerLoop, type WorkerRegistration } from './worker-loop.js';

const enqueueNeedsTransaction = (scope: string) =>
  `${scope} called IdempotencyContext.enqueue() without a claim transaction (external mode, or a delivery made by a test helper): a job is written in the claim's transaction, so that both commit or neither does; hand off from a transaction-mode handler`;

const enqueueBadQueue = (value: unknown) =>
  `IdempotencyContext.enqueue() needs a queue name (a non-empty string), got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

const enqueueBadOption = (option: string, expected: string, value: unknown) =>
  `IdempotencyContext.enqueue() option ${option} must be ${expected}, got ${String(value)}`;

/** What a bad `key` option is called in its message: the check's own words name it so. */
const enqueuedJob = (queue: string, scope: string) => `the job ${scope} enqueued on ${queue}`;

const queueMissing = (queue: string) =>
  `No job was written to queue ${queue}: pg-boss has no such queue. List it in handoff.queues (or name it in an @IdempotentWorker) so that IdempotencyModule creates it at boot`;

const handoffNotStarted = (queue: string) =>
  `No job was written to queue ${queue}: the handoff has not started yet (the application is still booting); the delivery rolls back and the sender retries`;

const workersWithoutHandoff = (where: string[]) =>
  `IdempotencyModule refuses to start: @IdempotentWorker on ${where.join(', ')} needs the handoff option (handoff: { queues: { ... } }), or its jobs would never run`;

const drainTimedOut = (count: number, drainMs: number) =>
  `Shutdown: ${count} job(s) still running after handoff.drainMs (${drainMs} ms) were left for pg-boss to hand out again once they expire`;

const pgBossSendChanged = (statements: number, returned: unknown, id: string) =>
  `pg-boss's send() did not write one job as pg-boss 10 does (${statements} statements, id ${String(returned)} for ${id}): this pg-boss is not one the handoff supports (^10.4)`;

/**
 * The handoff to workers, on pg-boss (an optional peer, loaded only with the `handoff` option):
 * its life in the app, and the job a delivery writes. At boot it finds the `@IdempotentWorker`
 * methods (worker.explorer.ts), starts pg-boss on the DataSource's pool in its own schema and
 * creates the queues (pg-boss-startup.ts). Once the app has started it runs a WorkerLoop per
 * worker; on shutdown it stops them, gives running jobs `drainMs`, and stops pg-boss. Several app
 * instances share the queues: pg-boss hands each job to one fetch at a time (SKIP LOCKED), and
 * its maintenance runs on one instance per interval. Internal: deliveries reach it through
 * `IdempotencyContext.enqueue()`, operators through HandoffQueues.
 */
@Injectable()
export class QueueHandoff implements JobEnqueuer, OnModuleInit, OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger('IdempotencyHandoff');
  private readonly handoff?: HandoffConfig;
  /** The handoff's statements on pg-boss's tables; undefined without the `handoff` option. */
  readonly statements?: QueueStatements;
  /** SQL on the DataSource's pool, pg-boss's and the queue figures' alike. */
  readonly db: SqlExecutor;
  private boss?: PgBoss;
  private workers: WorkerRegistration[] = [];
  private loops: WorkerLoop[] = [];
  /** Every queue created at boot → its settings. */
  readonly queues = new Map<string, QueueSettings>();
  private stopped = false;
  /** The module's `maxKeyLength`, which enqueue()'s `key` is checked against as every key is. */
  private readonly maxKeyLength: number;

  constructor(
    @Inject(IDEMPOTENCY_CONFIG) config: IdempotencyConfig,
    /** The claims' DataSource, whose pool the handoff writes through (HandoffQueues' retries too). */
    @Inject(IDEMPOTENCY_DATA_SOURCE) readonly dataSource: DataSource,
    private readonly runner: ClaimRunner,
    private readonly metrics: HandoffMetrics,
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly telemetry: DeliveryTelemetry,
  ) {
    this.db = poolExecutor(dataSource);
    this.maxKeyLength = config.maxKeyLength;
    if (config.handoff !== undefined) {
      // Already checked with the other options, so no suggestions are needed here.
      this.handoff = resolveHandoffOptions(config.handoff, () => undefined);
      this.statements = queueStatements(this.handoff.schema);
    }
  }

  /** pg-boss once started (for HandoffQueues' dead-letter retries), else undefined. */
  get pgBoss(): PgBoss | undefined {
    return this.boss;
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
    this.workers = findWorkers(this.discovery, this.scanner);
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
    this.boss = await startHandoffQueues(this.handoff, this.queues, await loadPgBoss(), this.db, this.logger);
  }

  /** Workers start once the whole app has: a job must not run against half-initialized providers. */
  onApplicationBootstrap(): void {
    if (!this.boss || !this.handoff) return;
    const deps = {
      boss: this.boss,
      runner: this.runner,
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
    const { startAfterSeconds, priority, key } = options ?? {};
    if (startAfterSeconds !== undefined && !(Number.isInteger(startAfterSeconds) && startAfterSeconds >= 0)) {
      throw new Error(enqueueBadOption('startAfterSeconds', 'a whole number of seconds', startAfterSeconds));
    }
    if (priority !== undefined && !Number.isInteger(priority)) {
      throw new Error(enqueueBadOption('priority', 'a whole number', priority));
    }
    // The user's key is refused as a claim's would be (400, the delivery writes nothing): the
    // worker's claim would refuse it, or a downstream could not carry it, after the 200.
    if (key !== undefined)
      checkJobKey(enqueuedJob(queue, delivery.scope), delivery.scope, key, this.maxKeyLength);
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
    // With OpenTelemetry, the job carries the delivery's trace context for the worker to continue.
    // The job's key is in its data: by default its id, so that the worker recognises the job by it
    // however often pg-boss hands it out, and a copy of it (a dead letter moved back) too.
    const payload = handoffPayload(event, key ?? id, data, this.telemetry.carrier());
    const sent = await this.boss.send(queue, payload, {
      db: withCommit,
      id,
      ...(startAfterSeconds ? { startAfter: startAfterSeconds } : {}),
      ...(priority !== undefined ? { priority } : {}),
    });
    if (written !== 1 || sent !== id) throw new Error(pgBossSendChanged(written, sent, id));
    return id;
  }
}

/** Checks enqueue()'s `key`; a bad one is the delivery's InvalidIdempotencyKeyError (400). */
function checkJobKey(what: string, scope: string, key: unknown, maxKeyLength: number): void {
  try {
    checkIdempotencyKey(what, key, maxKeyLength);
  } catch (error) {
    throw new InvalidIdempotencyKeyError((error as Error).message, scope, undefined);
  }
}
