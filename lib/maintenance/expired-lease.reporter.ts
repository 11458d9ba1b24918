import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
} from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import type { DataSource } from 'typeorm';
import { loadOptionalPeer } from '../core/optional-peer.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE, REPORTER_JOB_NAME } from '../idempotency.constants.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import { HandoffQueues } from '../transports/queue/handoff-queues.service.js';
import { hookFailed } from '../idempotency.messages.js';
import type {
  AbandonedClaim,
  ExpiredLease,
  IdempotencyConfig,
  PoisonEvent,
  ReporterRunOptions,
  ReporterRunResult,
} from '../interfaces/index.js';
import { describeError } from '../idempotency.messages.js';
import { applyVersionRetention } from './version-retention.js';

const expiredLease = (scope: string, key: string, attempts: number, ago: number) =>
  `expired lease: ${scope} key ${key} (attempt ${attempts}) expired ${Math.round(ago / 1000)} s ago; its worker probably died`;

const moreExpiredLeases = (count: number) => `... and ${count} more expired leases`;

const poisonEvent = (scope: string, key: string, attempts: number, lastError: string | null) =>
  `poison event: ${scope} key ${key} is not done after ${attempts} attempts${lastError ? ` (last error: ${lastError})` : ''}`;

const noScheduler = () =>
  'ScheduleModule is not imported: expired leases will not be reported. Import ScheduleModule.forRoot() once in your app, or set reporter: false.';

const reportFailed = (error: unknown) => `Expired-lease report failed: ${describeError(error)}`;

const abandonedClaimRemoved = (scope: string, key: string, status: string, attempts: number, days: number) =>
  `retention removed ${scope} key ${key}: ${status === 'failed' ? 'failed' : 'a dead lease'} after ${attempts} attempts, ${status === 'failed' ? 'last claimed' : 'its lease over'} more than ${days} days ago; its event will not be retried`;

const moreAbandonedClaims = (count: number) => `... and ${count} more abandoned claims removed`;

/** Warning lines per run; the rest is counted in one line. */
const MAX_LOGGED_LEASES = 50;
/** Leases handed to the `onExpiredLeases` hook per run. */
const MAX_REPORTED_LEASES = 1_000;
const MAX_POISON_EVENTS = 100;

/** The parts of @nestjs/schedule's SchedulerRegistry used here (it is an optional peer). */
interface Scheduler {
  addInterval(name: string, intervalId: ReturnType<typeof setInterval>): void;
  deleteInterval(name: string): void;
  addCronJob(name: string, job: unknown): void;
  deleteCronJob(name: string): void;
}

/**
 * The cron service of external mode: reports leases whose worker died holding them (and poison
 * events that keep failing, and handoff jobs in dead-letter queues), and deletes old done rows.
 * Registered through @nestjs/schedule's SchedulerRegistry; the app imports
 * `ScheduleModule.forRoot()` once (the library must not: each call adds an explorer and jobs would
 * run twice). Every replica runs the job; each tick is claimed in the claims table, so one replica
 * reports it.
 */
@Injectable()
export class ExpiredLeaseReporter implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger('ExpiredLeaseReporter');
  private scheduler?: Scheduler;
  private running = false;

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource,
    private readonly database: ClaimDatabase,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
    private readonly moduleRef: ModuleRef,
    private readonly handoff: HandoffQueues,
  ) {}

  async onApplicationBootstrap(): Promise<void> {
    if (!this.config.reporter) return;
    this.scheduler = await this.findScheduler();
    if (!this.scheduler) {
      this.logger.warn(noScheduler());
      return;
    }
    const tick = () => void this.tick();
    if (this.config.reportCron) {
      const { CronJob } = await loadOptionalPeer<typeof import('cron')>('cron');
      const job = CronJob.from({ cronTime: this.config.reportCron, onTick: tick, start: true });
      this.scheduler.addCronJob(REPORTER_JOB_NAME, job);
    } else {
      const timer = setInterval(tick, this.config.reportEveryMs);
      timer.unref();
      this.scheduler.addInterval(REPORTER_JOB_NAME, timer);
    }
  }

  onModuleDestroy(): void {
    if (!this.scheduler) return;
    try {
      if (this.config.reportCron) this.scheduler.deleteCronJob(REPORTER_JOB_NAME);
      else this.scheduler.deleteInterval(REPORTER_JOB_NAME);
    } catch {
      // Already removed by ScheduleModule's own shutdown.
    }
  }

  /**
   * One report: claims the current tick (skipped if another replica did; the gauge is still
   * refreshed), logs and counts expired leases, reports poison events, and applies retention.
   * Safe to call by hand; `{ force: true }` reports even when the tick was taken, so a run by
   * hand always answers with what it found.
   */
  async run(options: ReporterRunOptions = {}): Promise<ReporterRunResult> {
    // Claimed when forced too: the tick's scheduled run elsewhere then skips rather than repeat it.
    const [tick] = await this.dataSource.query(this.database.maintenance.tickClaim, [this.tickMs()]);
    if (!tick && options.force !== true) {
      // Another replica reports this tick, but this replica's gauge is scraped too: without a
      // refresh it would keep whatever it saw the last tick it won, possibly long ago.
      const [count] = await this.dataSource.query(this.database.maintenance.expiredLeaseCount);
      this.metrics.setExpiredLeases(Number(count?.total ?? 0));
      // Likewise the poison gauge, which the shipped alert rules read from every replica.
      this.metrics.setPoisonEvents((await this.findPoison()).length);
      await this.handoff.report(false);
      return {
        skipped: true,
        expired: [],
        expiredCount: 0,
        poison: [],
        deleted: 0,
        deletedVersions: 0,
        abandoned: [],
        deadLettered: [],
      };
    }
    await this.dataSource.query(this.database.maintenance.ticksPrune);

    const expired = await this.findExpired();
    const expiredCount = expired.total;
    this.metrics.setExpiredLeases(expiredCount);
    this.logExpired(expired.leases, expiredCount);
    if (expired.leases.length > 0) await this.callHook(expired.leases);

    const poison = await this.findPoison();
    this.metrics.setPoisonEvents(poison.length);
    for (const event of poison) {
      this.logger.error(poisonEvent(event.scope, event.key, event.attempts, event.lastError));
    }
    const deadLettered = await this.handoff.report(true);
    const { deleted, abandoned } = await this.applyRetention();
    // The ordering guard's versions, kept as long as the claims that set them.
    const deletedVersions = await applyVersionRetention(this.dataSource, this.database, this.config);
    return {
      skipped: false,
      expired: expired.leases,
      expiredCount,
      poison,
      deleted,
      deletedVersions,
      abandoned,
      deadLettered,
    };
  }

  private async tick(): Promise<void> {
    if (this.running) return; // a slow run is never stacked on itself
    this.running = true;
    try {
      await this.run();
    } catch (error) {
      this.logger.error(reportFailed(error));
    } finally {
      this.running = false;
    }
  }

  private async findExpired(): Promise<{ leases: ExpiredLease[]; total: number }> {
    const { expiredLeaseCount, expiredLeases } = this.database.maintenance;
    const [count] = await this.dataSource.query(expiredLeaseCount);
    const total = Number(count?.total ?? 0);
    if (total === 0) return { leases: [], total };
    const rows: Record<string, any>[] = await this.dataSource.query(expiredLeases, [MAX_REPORTED_LEASES]);
    const leases = rows.map((row) => {
      this.metrics.count('expired', row.scope, row.event_key);
      return {
        scope: row.scope,
        key: row.event_key,
        source: row.source,
        attempts: Number(row.attempts),
        claimedAt: new Date(row.claimed_at),
        leaseExpiresAt: new Date(row.lease_expires_at),
        expiredForMs: Number(row.expired_for_ms),
      };
    });
    return { leases, total };
  }

  private logExpired(leases: ExpiredLease[], total: number): void {
    for (const lease of leases.slice(0, MAX_LOGGED_LEASES)) {
      this.logger.warn(expiredLease(lease.scope, lease.key, lease.attempts, lease.expiredForMs));
    }
    if (total > MAX_LOGGED_LEASES) this.logger.warn(moreExpiredLeases(total - MAX_LOGGED_LEASES));
  }

  private async callHook(leases: ExpiredLease[]): Promise<void> {
    try {
      await this.config.onExpiredLeases?.(leases);
    } catch (error) {
      this.logger.error(hookFailed('onExpiredLeases', error));
    }
  }

  private async findPoison(): Promise<PoisonEvent[]> {
    const rows: Record<string, any>[] = await this.dataSource.query(this.database.maintenance.poisonEvents, [
      this.config.maxAttempts,
      MAX_POISON_EVENTS,
    ]);
    return rows.map((row) => ({
      scope: row.scope,
      key: row.event_key,
      source: row.source,
      status: row.status,
      attempts: Number(row.attempts),
      lastError: row.last_error,
    }));
  }

  /**
   * Deletes done rows older than `retentionDays`, then rows that will never finish (failed claims
   * last claimed that long ago, dead leases whose lease ran out that long ago), in batches of `retentionBatchSize`, at
   * most `retentionMaxBatches` of each per run: enough to keep up with
   * batchSize × maxBatches / reportEveryMs events a second (8,333 with the defaults).
   */
  private async applyRetention(): Promise<{ deleted: number; abandoned: AbandonedClaim[] }> {
    const { retentionDays, retentionBatchSize, retentionMaxBatches } = this.config;
    const { retentionBatch, abandonedRetentionBatch } = this.database.maintenance;
    let deleted = 0;
    for (let batch = 0; batch < retentionMaxBatches; batch++) {
      const affected = (await this.structured(retentionBatch, [retentionDays])).affected ?? 0;
      deleted += affected;
      if (affected < retentionBatchSize) break;
    }
    const abandoned: AbandonedClaim[] = [];
    for (let batch = 0; batch < retentionMaxBatches; batch++) {
      const { records: rows } = await this.structured(abandonedRetentionBatch, [retentionDays]);
      for (const row of rows) {
        abandoned.push({
          scope: row.scope,
          key: row.event_key,
          status: row.status,
          attempts: Number(row.attempts),
        });
      }
      if (rows.length < retentionBatchSize) break;
    }
    for (const claim of abandoned.slice(0, MAX_LOGGED_LEASES)) {
      this.logger.warn(
        abandonedClaimRemoved(claim.scope, claim.key, claim.status, claim.attempts, retentionDays),
      );
    }
    if (abandoned.length > MAX_LOGGED_LEASES) {
      this.logger.warn(moreAbandonedClaims(abandoned.length - MAX_LOGGED_LEASES));
    }
    return { deleted, abandoned };
  }

  /**
   * A DELETE's rows and count: TypeORM reports them only through a QueryRunner's structured
   * result (its plain query() answers a DELETE with a [rows, count] pair).
   */
  private async structured(
    sql: string,
    parameters: unknown[],
  ): Promise<{ records: Record<string, any>[]; affected?: number }> {
    const runner = this.dataSource.createQueryRunner();
    try {
      return await runner.query(sql, parameters, true);
    } finally {
      await runner.release();
    }
  }

  /** A tick's length in ms: the interval, or a minute for cron schedules. */
  private tickMs(): number {
    return this.config.reportCron ? 60_000 : this.config.reportEveryMs;
  }

  private async findScheduler(): Promise<Scheduler | undefined> {
    try {
      const { SchedulerRegistry } =
        await loadOptionalPeer<typeof import('@nestjs/schedule')>('@nestjs/schedule');
      return this.moduleRef.get(SchedulerRegistry, { strict: false }) as Scheduler;
    } catch {
      return undefined;
    }
  }
}
