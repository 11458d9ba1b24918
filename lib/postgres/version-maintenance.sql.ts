/**
 * Retention of the ordering guard's versions (version-table.ts), run by the reporter with the
 * claims' retention (maintenance.sql.ts): once a tick, by one replica, unnamed through TypeORM.
 */
import type { MaintenanceSettings } from './maintenance.sql.js';
import type { VersionTable } from './version-table.js';

/** The retention statements of one versions table. */
export interface VersionMaintenanceStatements {
  /** Whether the table exists: a module whose handlers have no guard may never have migrated it. $1 regclass. */
  readonly exists: string;
  /**
   * One batch of versions last applied more than `retentionDays` ago, found through the
   * `applied_at` index and deleted by their row addresses, as the claims' batches are. Kept at
   * least as long as claims: a version's `applied_at` is the `completed_at` of the claim that set
   * it (one transaction, one now()), and both go after the same number of days. ORDER BY walks the
   * index in order, so a generic plan (which cannot see how few rows are that old) still reads
   * only the batch, never the heap. A row a delivery advanced meanwhile has a new address and a new
   * `applied_at`, and is kept. $1 days.
   */
  readonly retentionBatch: string;
}

/** The statements for `versions`. */
export function versionMaintenanceStatements(
  versions: VersionTable,
  settings: MaintenanceSettings,
): VersionMaintenanceStatements {
  const v = versions.sql;
  const cutoff = `now() - $1::double precision * interval '1 day'`;
  return {
    exists: `SELECT to_regclass($1) IS NOT NULL AS present`,
    retentionBatch: `
DELETE FROM ${v} WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM ${v} WHERE applied_at < ${cutoff} ORDER BY applied_at LIMIT ${settings.retentionBatchSize}
)) AND applied_at < ${cutoff}`,
  };
}
