/**
 * The ordering guard's claim: the transaction claim and the entity's version check and advance in
 * one statement, sent in the claim's place (ClaimVariant), so the guard costs no round trip and no
 * statement of its own. Prepared once per connection like the claim.
 *
 * Why both go with the claim, rather than the check with the claim and the advance with the
 * COMMIT: the first event of a new entity has no row to lock, so a check alone (a SELECT ... FOR
 * UPDATE) would let two replicas with that entity's first two events both see "nothing applied"
 * and both apply. An upsert locks either way: the unique index makes the second insert wait on the
 * first's uncommitted one, and ON CONFLICT DO UPDATE locks the existing row even when its WHERE
 * (the version comparison) is false. Its write is part of the claim's transaction, so a rollback
 * advances nothing; the lock is held to the COMMIT either way, so writing at the claim costs no
 * more contention than writing at the COMMIT would.
 */
import { claimWithCompanions, DURABLE_COMMIT, statementName } from './claim.sql.js';
import type { ClaimTable } from './claim-table.js';
import type { ClaimStatement } from './statement-executor.js';
import type { VersionTable } from './version-table.js';

/** The ordered claims of one claims table: equal versions applied, or stale. */
export interface OrderedClaimStatements {
  /** An event whose version equals the applied one is applied (`equalVersions: 'apply'`). */
  readonly applyEqual: ClaimStatement;
  /** An event whose version equals the applied one is stale (`equalVersions: 'stale'`). */
  readonly staleEqual: ClaimStatement;
}

/**
 * The parameter types of an ordered claim, for PREPARE: the claim's four (five with key checks,
 * the fingerprint last), then the guard's scope, entity and version.
 */
export function orderedClaimTypes(checked: boolean): readonly string[] {
  return [...Array<string>(checked ? 5 : 4).fill('text'), 'text', 'text', 'numeric'];
}

/** The row an ordered claim answers: the transaction claim's columns, then the guard's. */
export interface OrderedClaimRow {
  claimed: boolean;
  status: string | null;
  previous: string;
  /** The event is older than its entity's applied version (or as old, with `staleEqual`). */
  stale: boolean;
  /** The applied version when stale, if the statement's snapshot saw it (a text of a numeric). */
  applied_version: string | null;
  /** With key checks: the found claim's fingerprint and stored response (null when claimed). */
  fingerprint?: string | null;
  response?: unknown;
}

/**
 * The statements for `claims` and its `versions` table.
 *
 * What it does, and why it is written so. `bound`, `claim` and the answer's first three columns
 * are the transaction claim's (claim.sql.ts), with one difference: the previous lock_timeout is put
 * back at the very end, once both writes are done, not in the claim's RETURNING, so the version
 * upsert waits under the same bound as the claim. A second event of an entity whose first is still
 * open at another replica waits on that entity's row for at most `concurrentDuplicateWaitMs`, then
 * gets 55P03 (answered in flight, as a duplicate is); if the first commits meanwhile, the upsert
 * compares with the first's version (READ COMMITTED re-reads a row it waited for; at REPEATABLE
 * READ or above it fails with 40001 and the whole delivery runs again). `advanced` is skipped when
 * the event's claim is already done in the statement's snapshot: a replay writes nothing and waits
 * on no entity. Anything else (a new claim, a failed or expired one to take back, a row committed
 * after the snapshot) checks the version here, so a reclaim in settle() has been checked too.
 * `outcome` is MATERIALIZED so that both writes have run before the answer's last column puts the
 * lock_timeout back. `applied_version`, for the stale log, comes from the snapshot: null when the
 * newer event committed while this one waited.
 *
 * With key checks (`checked`) the claim stores the fingerprint, and a claim found answers its
 * fingerprint and stored response too, as claimStatements' checked transaction claim does.
 *
 * $1 scope, $2 key, $3 source, $4 lock_timeout, [$5 fingerprint,] then the guard's scope, entity
 * and version.
 */
export function orderedClaimStatements(
  claims: ClaimTable,
  versions: VersionTable,
  checked = false,
  /** The checked statements' storeResponse, prepared with each (ClaimStatement.companions). */
  storeResponse?: ClaimStatement,
): OrderedClaimStatements {
  // The guard's parameters follow the claim's: after the fingerprint when there is one.
  const [gs, entity, version] = checked ? ['$6', '$7', '$8'] : ['$5', '$6', '$7'];
  const fingerprintColumn = checked ? ', fingerprint' : '';
  const fingerprintValue = checked ? ', $5' : '';
  const found = checked
    ? `,
       CASE WHEN o.claimed THEN NULL ELSE (SELECT fingerprint FROM seen) END AS fingerprint,
       CASE WHEN o.claimed THEN NULL ELSE (SELECT response FROM seen) END AS response`
    : '';
  const statement = (role: string, comparison: '<=' | '<'): ClaimStatement => {
    const text = `
WITH bound AS (
  SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', $4, true) AS applied,
         ${DURABLE_COMMIT} AS durable
), seen AS (
  SELECT status${checked ? ', fingerprint, response' : ''} FROM ${claims.sql} WHERE scope = $1 AND event_key = $2
), claim AS (
  INSERT INTO ${claims.sql} (scope, event_key, source, status, completed_at${fingerprintColumn})
  SELECT $1, $2, $3, 'done', now()${fingerprintValue} FROM bound
  ON CONFLICT (scope, event_key) DO NOTHING
  RETURNING 1
), advanced AS (
  INSERT INTO ${versions.sql} AS v (scope, entity, version, applied_at)
  SELECT ${gs}, ${entity}, ${version}, now() FROM bound
  WHERE NOT EXISTS (SELECT 1 FROM seen WHERE status = 'done')
  ON CONFLICT (scope, entity) DO UPDATE SET version = EXCLUDED.version, applied_at = EXCLUDED.applied_at
  WHERE v.version ${comparison} EXCLUDED.version
  RETURNING 1
), outcome AS MATERIALIZED (
  SELECT EXISTS (SELECT 1 FROM claim) AS claimed,
         EXISTS (SELECT 1 FROM advanced) AS advanced,
         EXISTS (SELECT 1 FROM seen WHERE status = 'done') AS done
)
SELECT o.claimed,
       CASE WHEN o.claimed THEN NULL ELSE (SELECT status FROM seen) END AS status,
       b.previous,
       NOT o.advanced AND NOT o.done AS stale,
       CASE WHEN o.advanced OR o.done THEN NULL
            ELSE (SELECT version::text FROM ${versions.sql} WHERE scope = ${gs} AND entity = ${entity}) END AS applied_version${found},
       set_config('lock_timeout', b.previous, true) AS lock_timeout
FROM outcome AS o, bound AS b`;
    return storeResponse
      ? claimWithCompanions(role, text, undefined, [{ role: 'store_response', statement: storeResponse }])
      : { name: statementName(role, text), text };
  };
  const checkedRole = checked ? '_checked' : '';
  return {
    applyEqual: statement(`ordered_claim${checkedRole}`, '<='),
    staleEqual: statement(`ordered_claim_strict${checkedRole}`, '<'),
  };
}
