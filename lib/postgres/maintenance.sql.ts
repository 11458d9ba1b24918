/**
 * The statements of the expired-lease reporter and retention, built once per module for its table.
 * Run once a tick by one replica, so they go unnamed through TypeORM. Each is served by one of the
 * table's indexes and stays within milliseconds at tens of millions of rows (measured by
 * `npm run bench:scale`), under a custom plan or a generic one (`plan_cache_mode`, a pooler that
 * prepares statements): what is fixed per module, the reporter's scope and the retention batch
 * size, is written into the text, because as a parameter a generic plan estimates `scope = $1` at
 * a sixth of the table (the ticks prune became a 3 s sequential scan at 10M rows) and `LIMIT $2` at
 * a tenth of the old rows (the retention batch, a hash join over the whole heap: 9-13 s).
 */
import { REPORTER_SCOPE } from '../idempotency.constants.js';
import { quoteLiteral, type ClaimTable } from './claim-table.js';

/** The reporter's scope as an SQL literal. */
const REPORTER = quoteLiteral(REPORTER_SCOPE);

/** What the statements are built with, fixed for the module's life. */
export interface MaintenanceSettings {
  /** Rows a retention batch deletes at most (the `retentionBatchSize` option, a positive integer). */
  readonly retentionBatchSize: number;
}

/** The maintenance statements of one claims table. */
export interface MaintenanceStatements {
  /**
   * The reporter claims its tick (the database clock divided into `reportEveryMs` slots) in the
   * claims table itself, so with many replicas exactly one reports per tick. $1 interval ms.
   */
  readonly tickClaim: string;
  /** Old tick claims are only noise. */
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
   * that are not done), never the whole heap. $1 max attempts, $2 limit.
   */
  readonly poisonEvents: string;
  /**
   * The health indicator's figures in one round trip: poison events (from the unfinished index)
   * and expired leases (from the expiring index, as expiredLeaseCount). That it answers at all
   * says the claims table is reachable. $1 max attempts.
   */
  readonly healthCounts: string;
  /**
   * One retention batch of done rows, found through the retention index and deleted by their row
   * addresses (a TID scan: no join for the planner to choose, no primary-key lookups; 5-7 ms for
   * 5,000 rows at 10M, against 45-130 ms joined on the key). A row updated meanwhile has a new
   * address and is skipped. $1 days.
   */
  readonly retentionBatch: string;
  /**
   * One retention batch of rows that will never finish: failed claims last claimed more than
   * `retentionDays` ago (from the failed index) and dead leases whose lease ran out that long ago
   * and were last claimed before that (from the expiring index; a lease that a heartbeat kept alive
   * until lately is kept). Each
   * branch reads only what it deletes, not every unfinished claim. Returned, so the reporter can
   * say which events it gave up on. $1 days.
   */
  readonly abandonedRetentionBatch: string;
}

/** The statements for `table`. */
export function maintenanceStatements(
  table: ClaimTable,
  settings: MaintenanceSettings,
): MaintenanceStatements {
  const t = table.sql;
  // Checked at start-up (a positive whole number), so it can be part of the text.
  const batch = settings.retentionBatchSize;
  const cutoff = `now() - $1::double precision * interval '1 day'`;
  return {
    tickClaim: `
INSERT INTO ${t} (scope, event_key, source, status, completed_at)
VALUES (${REPORTER}, FLOOR(EXTRACT(EPOCH FROM now()) * 1000 / $1::double precision)::bigint::text, 'idempotency', 'done', now())
ON CONFLICT (scope, event_key) DO NOTHING
RETURNING event_key`,
    ticksPrune: `
DELETE FROM ${t} WHERE scope = ${REPORTER} AND completed_at < now() - interval '1 day'`,
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
WHERE status <> 'done' AND attempts >= $1 AND scope <> ${REPORTER}
ORDER BY attempts DESC
LIMIT $2`,
    healthCounts: `
SELECT (SELECT COUNT(*)::int FROM ${t} WHERE status <> 'done' AND attempts >= $1 AND scope <> ${REPORTER}) AS poison,
       (SELECT COUNT(*)::int FROM ${t} WHERE status = 'in_progress' AND lease_expires_at < now()) AS expired`,
    retentionBatch: `
DELETE FROM ${t} WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM ${t}
  WHERE status = 'done' AND completed_at < ${cutoff}
  LIMIT ${batch}
)) AND status = 'done'`,
    abandonedRetentionBatch: `
DELETE FROM ${t} WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM (
    SELECT ctid FROM ${t}
    WHERE status = 'in_progress' AND lease_expires_at < ${cutoff} AND claimed_at < ${cutoff}
    UNION ALL
    SELECT ctid FROM ${t} WHERE status = 'failed' AND claimed_at < ${cutoff}
  ) AS abandoned
  LIMIT ${batch}
)) AND status <> 'done'
RETURNING scope, event_key, status, attempts`,
  };
}
