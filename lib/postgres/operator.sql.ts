/**
 * The statements of the operator tools (`IdempotencyClaims` and the `claims` CLI), built once per
 * claims table, shared by both so the service and the CLI cannot disagree on what a state means.
 * Run by hand, rarely, so they go unnamed: Postgres plans each with its actual values, folding the
 * optional filters (`$2::varchar IS NULL OR ...`) away, so a filter that is absent costs nothing and
 * the partial indexes serve the unfinished states. Times come from the database clock, as the
 * claims' do. The reporter's tick rows are never listed.
 */
import { REPORTER_SCOPE } from '../idempotency.constants.js';
import { quoteLiteral, type ClaimTable } from './claim-table.js';

/** What `list` can select: a claim state, or `poison` (not done after `maxAttempts` attempts). */
export type ClaimListStatement = 'all' | 'in_progress' | 'expired' | 'failed' | 'poison' | 'done';

/** The operator statements of one claims table. */
export interface OperatorStatements {
  /**
   * One statement per selection, each ordered most recently claimed first (poison: most attempts
   * first), `$1` max attempts (for the `poison` column), `$2` scope or null, `$3` minimum age in
   * ms (since `claimed_at`) or null, `$4` limit. `in_progress` is a live lease, `expired` an
   * in-progress claim whose lease has run out, which the next delivery re-claims. `all` and
   * `done` read the whole table (or the scope's part of it, through the primary key).
   */
  readonly list: Readonly<Record<ClaimListStatement, string>>;
  /** One claim. $1 scope, $2 key, $3 max attempts. */
  readonly show: string;
  /**
   * Takes an in-progress claim (live or expired) away from its holder: `failed`, with no token,
   * so the next delivery claims it at once (attempt + 1) in either mode, the holder's completion,
   * failure mark and heartbeat all match nothing (they are fenced on `in_progress` and the token),
   * and the reporter does not report a lease nobody died holding. `lease_expires_at` is kept, so
   * `lease_live` answers whether the lease was still live. Waits at most `$5` (a lock_timeout,
   * '5000ms') for a delivery that holds the row. No row: nothing in progress.
   * $1 scope, $2 key, $3 max attempts, $4 last_error, $5 lock_timeout.
   */
  readonly release: string;
  /**
   * Deletes a claim that no live lease holds (done, failed, or expired), so the next delivery is
   * a first delivery (attempt 1) and runs the handler again. Returns the row as it was. Waits at
   * most `$4` for a transaction-mode delivery that holds the row (a failed claim being retried),
   * rather than delete what that delivery commits. No row: none, or a live lease.
   * $1 scope, $2 key, $3 max attempts, $4 lock_timeout.
   */
  readonly forget: string;
}

/** A claim in progress whose lease has not run out; a missing expiry never ran out (nor is it claimable). */
const LIVE = `COALESCE(lease_expires_at > now(), true)`;

/**
 * A claim row as the operator tools read it, `maxAttempts` being the parameter that holds it:
 * `state` folds the lease's expiry into the status, ages are ms on the database clock.
 */
function claimColumns(maxAttempts: string): string {
  return `scope, event_key, source, attempts, lease_token, claimed_at, lease_expires_at, completed_at, last_error,
  CASE WHEN status <> 'in_progress' THEN status WHEN ${LIVE} THEN 'in_progress' ELSE 'expired' END AS state,
  (status <> 'done' AND attempts >= ${maxAttempts}) AS poison,
  GREATEST(0, EXTRACT(EPOCH FROM (now() - claimed_at)) * 1000)::bigint AS age_ms,
  CASE WHEN status = 'in_progress' AND lease_expires_at > now()
       THEN (EXTRACT(EPOCH FROM (lease_expires_at - now())) * 1000)::bigint END AS lease_left_ms`;
}

/** The statements for `table`. */
export function operatorStatements(table: ClaimTable): OperatorStatements {
  const t = table.sql;
  const notReporter = `scope <> ${quoteLiteral(REPORTER_SCOPE)}`;
  const list = (where: string, order = 'claimed_at DESC') => `
SELECT ${claimColumns('$1')}
FROM ${t}
WHERE ${where} AND ${notReporter}
  AND ($2::varchar IS NULL OR scope = $2::varchar)
  AND ($3::double precision IS NULL OR claimed_at <= now() - $3::double precision * interval '1 millisecond')
ORDER BY ${order}, scope, event_key
LIMIT $4`;
  return {
    list: {
      all: list('true'),
      in_progress: list(`status = 'in_progress' AND ${LIVE}`),
      expired: list(`status = 'in_progress' AND lease_expires_at <= now()`),
      failed: list(`status = 'failed'`),
      poison: list(`status <> 'done' AND attempts >= $1`, 'attempts DESC, claimed_at DESC'),
      done: list(`status = 'done'`),
    },
    show: `
SELECT ${claimColumns('$3')}
FROM ${t} WHERE scope = $1 AND event_key = $2`,
    release: `
WITH bound AS (SELECT set_config('lock_timeout', $5, true) AS applied)
UPDATE ${t} AS pe SET status = 'failed', lease_token = NULL, last_error = $4
FROM bound
WHERE pe.scope = $1 AND pe.event_key = $2 AND pe.status = 'in_progress'
RETURNING ${claimColumns('$3')}, COALESCE(pe.lease_expires_at > now(), true) AS lease_live`,
    forget: `
WITH bound AS (SELECT set_config('lock_timeout', $4, true) AS applied)
DELETE FROM ${t} AS pe
USING bound
WHERE pe.scope = $1 AND pe.event_key = $2
  AND (pe.status <> 'in_progress' OR pe.lease_expires_at <= now())
RETURNING ${claimColumns('$3')}`,
  };
}
