import { Inject, Injectable, Logger } from '@nestjs/common';
import type { DataSource } from 'typeorm';
import { IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig, PoisonEvent } from '../interfaces/index.js';
import { ClaimDatabase } from '../postgres/claim-database.js';

const poisonEvent = (scope: string, key: string, attempts: number, lastError: string | null) =>
  `poison event: ${scope} key ${key} is not done after ${attempts} attempts${lastError ? ` (last error: ${lastError})` : ''}`;

/** Poison events read (and logged) per run. */
const MAX_POISON_EVENTS = 100;

/**
 * Reports poison events: claims not done after `maxAttempts` attempts (a handler that fails on
 * every delivery), logged as errors and counted in the poison gauge. Run on each maintenance tick
 * by ExpiredLeaseReporter, which schedules the tick; the log only on the replica that won it, the
 * gauge on every replica, as the shipped alert rules read it from each.
 */
@Injectable()
export class PoisonEventReporter {
  private readonly logger = new Logger('ExpiredLeaseReporter');

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource,
    private readonly database: ClaimDatabase,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
  ) {}

  /** Reads the poison events (at most 100), sets the gauge, and with `log` logs each. */
  async report(log: boolean): Promise<PoisonEvent[]> {
    const poison = await this.find();
    this.metrics.setPoisonEvents(poison.length);
    if (log) {
      for (const event of poison) {
        this.logger.error(poisonEvent(event.scope, event.key, event.attempts, event.lastError));
      }
    }
    return poison;
  }

  private async find(): Promise<PoisonEvent[]> {
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
}
