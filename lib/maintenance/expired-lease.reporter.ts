import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
} from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import type { DataSource } from 'typeorm';
import {
  EXPIRED_LEASE_COUNT,
  EXPIRED_LEASES,
  POISON_EVENTS,
  REPORTER_TICK_CLAIM,
  REPORTER_TICKS_PRUNE,
  RETENTION_BATCH,
} from '../postgres/maintenance.sql.js';
import {
  IDEMPOTENCY_CONFIG,
  IDEMPOTENCY_DATA_SOURCE,
  REPORTER_JOB_NAME,
  REPORTER_SCOPE,
} from '../idempotency.constants.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import {
  expiredLease,
  hookFailed,
  moreExpiredLeases,
  noScheduler,
  poisonEvent,
  reportFailed,
} from '../idempotency.messages.js';
import type { ExpiredLease, IdempotencyConfig, PoisonEvent, ReporterRunResult } from '../interfaces/index.js';

/** Warning lines per run; the rest is counted in one line. */
const MAX_LOGGED_LEASES = 50;
/** Leases handed to the `onExpiredLeases` hook per run. */
const MAX_REPORTED_LEASES = 1_000;
const MAX_POISON_EVENTS = 100;
/** Retention batches per run, so one run stays short even after a long outage. */
const MAX_RETENTION_BATCHES = 100;

/** The parts of @nestjs/schedule's SchedulerRegistry used here (it is an optional peer). */
interface Scheduler {
  addInterval(name: string, intervalId: ReturnType<typeof setInterval>): void;
  deleteInterval(name: string): void;
  addCronJob(name: string, job: unknown): void;
  deleteCronJob(name: string): void;
}

/**
 * The cron service of external mode: reports leases whose worker died holding them (and poison
 * events that keep failing), and deletes old done rows. Registered through @nestjs/schedule's
 * SchedulerRegistry; the app imports `ScheduleModule.forRoot()` once (the library must not: each
 * call adds an explorer and jobs would run twice). Every replica runs the job; each tick is
 * claimed in the claims table, so one replica reports it.
 */
@Injectable()
export class ExpiredLeaseReporter implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger('ExpiredLeaseReporter');
  private scheduler?: Scheduler;
  private running = false;

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
    private readonly moduleRef: ModuleRef,
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
      const { CronJob } = await import('cron');
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
   * Safe to call by hand.
   */
  async run(): Promise<ReporterRunResult> {
    const [tick] = await this.dataSource.query(REPORTER_TICK_CLAIM, [REPORTER_SCOPE, this.tickMs()]);
    if (!tick) {
      // Another replica reports this tick, but this replica's gauge is scraped too: without a
      // refresh it would keep whatever it saw the last tick it won, possibly long ago.
      const [count] = await this.dataSource.query(EXPIRED_LEASE_COUNT);
      this.metrics.setExpiredLeases(Number(count?.total ?? 0));
      return { skipped: true, expired: [], expiredCount: 0, poison: [], deleted: 0 };
    }
    await this.dataSource.query(REPORTER_TICKS_PRUNE, [REPORTER_SCOPE]);

    const expired = await this.findExpired();
    const expiredCount = expired.total;
    this.metrics.setExpiredLeases(expiredCount);
    this.logExpired(expired.leases, expiredCount);
    if (expired.leases.length > 0) await this.callHook(expired.leases);

    const poison = await this.findPoison();
    for (const event of poison) {
      this.logger.error(poisonEvent(event.scope, event.key, event.attempts, event.lastError));
    }
    const deleted = await this.applyRetention();
    return { skipped: false, expired: expired.leases, expiredCount, poison, deleted };
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
    const rows: Record<string, any>[] = await this.dataSource.query(EXPIRED_LEASES, [MAX_REPORTED_LEASES]);
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
    return { leases, total: Number(rows[0]?.total ?? 0) };
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
    const rows: Record<string, any>[] = await this.dataSource.query(POISON_EVENTS, [
      this.config.maxAttempts,
      REPORTER_SCOPE,
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

  private async applyRetention(): Promise<number> {
    let deleted = 0;
    for (let batch = 0; batch < MAX_RETENTION_BATCHES; batch++) {
      const runner = this.dataSource.createQueryRunner();
      try {
        const result = await runner.query(
          RETENTION_BATCH,
          [this.config.retentionDays, this.config.retentionBatchSize],
          true,
        );
        deleted += result.affected ?? 0;
        if ((result.affected ?? 0) < this.config.retentionBatchSize) break;
      } finally {
        await runner.release();
      }
    }
    return deleted;
  }

  /** A tick's length in ms: the interval, or a minute for cron schedules. */
  private tickMs(): number {
    return this.config.reportCron ? 60_000 : this.config.reportEveryMs;
  }

  private async findScheduler(): Promise<Scheduler | undefined> {
    try {
      const { SchedulerRegistry } = await import('@nestjs/schedule');
      return this.moduleRef.get(SchedulerRegistry, { strict: false }) as Scheduler;
    } catch {
      return undefined;
    }
  }
}
