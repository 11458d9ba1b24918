import type { DataSource } from 'typeorm';
import type { IdempotencyConfig } from '../interfaces/index.js';
import type { ClaimDatabase } from '../postgres/claim-database.js';

/**
 * Removes the ordering guard's versions last applied more than `retentionDays` ago, in batches of
 * `retentionBatchSize`, at most `retentionMaxBatches` per run, as the claims' retention does
 * (ExpiredLeaseReporter), and says how many. Nothing when the versions table does not exist: a
 * module without an ordering guard need not have run its migration. Once a version is gone, its
 * entity's next event is applied whatever its version: the claims of the events it ordered are
 * gone too by then, so a redelivery that late would be processed again anyway.
 */
export async function applyVersionRetention(
  dataSource: DataSource,
  database: ClaimDatabase,
  config: Pick<IdempotencyConfig, 'retentionDays' | 'retentionBatchSize' | 'retentionMaxBatches'>,
): Promise<number> {
  const { exists, retentionBatch } = database.versionMaintenance;
  const [table] = await dataSource.query(exists, [database.versions.regclass]);
  if (!table?.present) return 0;
  let deleted = 0;
  for (let batch = 0; batch < config.retentionMaxBatches; batch++) {
    // A DELETE's count comes only through a QueryRunner's structured result.
    const runner = dataSource.createQueryRunner();
    let affected: number;
    try {
      affected = (await runner.query(retentionBatch, [config.retentionDays], true)).affected ?? 0;
    } finally {
      await runner.release();
    }
    deleted += affected;
    if (affected < config.retentionBatchSize) break;
  }
  return deleted;
}
