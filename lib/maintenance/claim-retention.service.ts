import { Inject, Injectable, Logger } from '@nestjs/common';
import type { DataSource } from 'typeorm';
import { IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';
import type { AbandonedClaim, IdempotencyConfig } from '../interfaces/index.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { applyVersionRetention } from './version-retention.js';

const abandonedClaimRemoved = (scope: string, key: string, status: string, attempts: number, days: number) =>
  `retention removed ${scope} key ${key}: ${status === 'failed' ? 'failed' : 'a dead lease'} after ${attempts} attempts, ${status === 'failed' ? 'last claimed' : 'its lease over'} more than ${days} days ago; its event will not be retried`;

const moreAbandonedClaims = (count: number) => `... and ${count} more abandoned claims removed`;

/** Warning lines per run; the rest is counted in one line. */
const MAX_LOGGED_CLAIMS = 50;

/** What one retention run removed. */
export interface RetentionResult {
  /** Done claims removed. */
  readonly deleted: number;
  /** Claims that will never finish, removed (each logged, up to 50). */
  readonly abandoned: AbandonedClaim[];
  /** The ordering guard's versions removed. */
  readonly deletedVersions: number;
}

/**
 * Retention: deletes claims older than `retentionDays` (done ones, then failed claims and dead
 * leases, which will never finish) and the ordering guard's versions as old. Run on each
 * maintenance tick by ExpiredLeaseReporter, which schedules the tick, on the replica that won it.
 */
@Injectable()
export class ClaimRetention {
  private readonly logger = new Logger('ExpiredLeaseReporter');

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource,
    private readonly database: ClaimDatabase,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
  ) {}

  /** One run: the claims' retention, then the versions'. */
  async apply(): Promise<RetentionResult> {
    const { deleted, abandoned } = await this.applyToClaims();
    // The ordering guard's versions, kept as long as the claims that set them.
    const deletedVersions = await applyVersionRetention(this.dataSource, this.database, this.config);
    return { deleted, abandoned, deletedVersions };
  }

  /**
   * Deletes done rows older than `retentionDays`, then rows that will never finish (failed claims
   * last claimed that long ago, dead leases whose lease ran out that long ago), in batches of `retentionBatchSize`, at
   * most `retentionMaxBatches` of each per run: enough to keep up with
   * batchSize × maxBatches / reportEveryMs events a second (8,333 with the defaults).
   */
  private async applyToClaims(): Promise<{ deleted: number; abandoned: AbandonedClaim[] }> {
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
    for (const claim of abandoned.slice(0, MAX_LOGGED_CLAIMS)) {
      this.logger.warn(
        abandonedClaimRemoved(claim.scope, claim.key, claim.status, claim.attempts, retentionDays),
      );
    }
    if (abandoned.length > MAX_LOGGED_CLAIMS) {
      this.logger.warn(moreAbandonedClaims(abandoned.length - MAX_LOGGED_CLAIMS));
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
}
