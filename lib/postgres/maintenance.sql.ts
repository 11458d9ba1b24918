/**
 * The statements of the expired-lease reporter and retention, built once per module for its table.
 * Run once a tick by one replica, so they go unnamed through TypeORM. Each is served by one of the
 * table's indexes and stays within a few milliseconds at tens of millions of rows (measured by
 * `npm run bench:scale`), under a custom plan or a generic one.
 */
import type { ClaimTable } from './claim-table.js';

/** The maintenance statements of one claims table. */
export interface MaintenanceStatements {
  /**
   * The reporter claims its tick (the database clock divided into `reportEveryMs` slots) in the
   * claims table itself, so with many replicas exactly one reports per tick.
   * $1 reporter scope, $2 interval ms.
   */
  readonly tickClaim: string;
  /** Old tick claims are only noise. $1 reporter scope. */
  readonly ticksPrune: string;
  /**
   * How many leases have expired. A count over the expiring index alone (no window function over
   * every expired row): it stays fast with hundreds of thousands of them.
   */
  readonly expiredLeaseCount: string;
  /** Leases whose worker died holding them, oldest first. $1 limit. */
  readonly expiredLeases: string;
  /**
   * Claims that keep failing or dying, most attempts first, from the unfinished index (only rows
   * that are not done), never the whole heap. $1 max attempts, $2 reporter scope, $3 limit.
   */
  readonly poisonEvents: string;
  /**
   * One retention batch of done rows, through the retention index. Joined on the primary key
   * rather than ctid, so it also runs on distributed tables (Citus). $1 days, $2 batch size.
   */
  readonly retentionBatch: string;
  /**
   * One retention batch of rows that will never finish: failed attempts and dead leases (expired,
   * still in progress) last claimed more than `retentionDays` ago. Returned, so the reporter can
   * say which events it gave up on. $1 days, $2 batch size, $3 reporter scope.
   */
  readonly abandonedRetentionBatch: string;
}

/** The statements for `table`. */
export function maintenanceStatements(table: ClaimTable): MaintenanceStatements {
  const t = table.sql;
  return {
    tickClaim: `
INSERT INTO ${t} (scope, event_key, source, status, completed_at)
VALUES ($1, FLOOR(EXTRACT(EPOCH FROM now()) * 1000 / $2::double precision)::bigint::text, 'idempotency', 'done', now())
ON CONFLICT (scope, event_key) DO NOTHING
RETURNING event_key`,
    ticksPrune: `
DELETE FROM ${t} WHERE scope = $1 AND completed_at < now() - interval '1 day'`,
    expiredLeaseCount: `
SELECT COUNT(*)::int AS total FROM ${t} WHERE status = 'in_progress' AND lease_expires_at < now()`,
    expiredLeases: `
SELECT scope, event_key, source, attempts, claimed_at, lease_expires_at,
       (EXTRACT(EPOCH FROM (now() - lease_expires_at)) * 1000)::bigint AS expired_for_ms
FROM ${t}
WHERE status = 'in_progress' AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT $1`,
    poisonEvents: `
SELECT scope, event_key, source, status, attempts, last_error
FROM ${t}
WHERE status <> 'done' AND attempts >= $1 AND scope <> $2
ORDER BY attempts DESC
LIMIT $3`,
    retentionBatch: `
DELETE FROM ${t} AS pe
USING (
  SELECT scope, event_key FROM ${t}
  WHERE status = 'done' AND completed_at < now() - $1::double precision * interval '1 day'
  LIMIT $2
) AS old
WHERE pe.scope = old.scope AND pe.event_key = old.event_key AND pe.status = 'done'`,
    abandonedRetentionBatch: `
DELETE FROM ${t} AS pe
USING (
  SELECT scope, event_key FROM ${t}
  WHERE status <> 'done' AND scope <> $3
    AND claimed_at < now() - $1::double precision * interval '1 day'
    AND (status = 'failed' OR lease_expires_at < now())
  LIMIT $2
) AS old
WHERE pe.scope = old.scope AND pe.event_key = old.event_key AND pe.status <> 'done'
RETURNING pe.scope, pe.event_key, pe.status, pe.attempts`,
  };
}
