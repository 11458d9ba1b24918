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
  ExpiredLease,
  IdempotencyConfig,
  ReporterRunOptions,
  ReporterRunResult,
} from '../interfaces/index.js';
import { describeError } from '../idempotency.messages.js';
import { ClaimRetention } from './claim-retention.service.js';
import { PoisonEventReporter } from './poison-event.reporter.js';

const expiredLease = (scope: string, key: string, attempts: number, ago: number) =>
  `expired lease: ${scope} key ${key} (attempt ${attempts}) expired ${Math.round(ago / 1000)} s ago; its worker probably died`;

const moreExpiredLeases = (count: number) => `... and ${count} more expired leases`;

const noScheduler = () =>
  'ScheduleModule is not imported: expired leases will not be reported. Import ScheduleModule.forRoot() once in your app, or set reporter: false.';

const reportFailed = (error: unknown) => `Expired-lease report failed: ${describeError(error)}`;

/** Warning lines per run; the rest is counted in one line. */
const MAX_LOGGED_LEASES = 50;
/** Leases handed to the `onExpiredLeases` hook per run. */
const MAX_REPORTED_LEASES = 1_000;

/** The parts of @nestjs/schedule's SchedulerRegistry used here (it is an optional peer). */
interface Scheduler {
  addInterval(name: string, intervalId: ReturnType<typeof setInterval>): void;
  deleteInterval(name: string): void;
  addCronJob(name: string, job: unknown): void;
  deleteCronJob(name: string): void;
}

/**
 * The cron service of external mode: reports leases whose worker died holding them. It schedules
 * the maintenance tick, whose other jobs are services of their own, run in the same tick: poison
 * events that keep failing (PoisonEventReporter), handoff jobs in dead-letter queues
 * (HandoffQueues), and retention (ClaimRetention). Registered through @nestjs/schedule's SchedulerRegistry; the app imports
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
    private readonly poison: PoisonEventReporter,
    private readonly retention: ClaimRetention,
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
   * One report: claims the current tick (skipped if another replica did; the gauges are still
   * refreshed), logs and counts expired leases, then runs the tick's other jobs: poison events,
   * dead letters, retention.
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
      // Likewise the poison and dead-letter gauges, which the shipped alert rules read from every replica.
      await this.poison.report(false);
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

    // The other maintenance jobs of the tick, each its own service.
    const poison = await this.poison.report(true);
    const deadLettered = await this.handoff.report(true);
    const { deleted, abandoned, deletedVersions } = await this.retention.apply();
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
