/**
 * The statements of handlers with key checks (`@IdempotentRequest`, `@IdempotentWebhook`): the
 * same roles and the same round trips as claim.sql.ts's, with the `fingerprint` and `response`
 * columns of migration 1765584000000. Each takes what it adds as its last parameters, so a
 * strategy appends them to the values it sends either way. Each is prepared under its role's name
 * with the hash of its own text (statementName), so it never meets the unchecked statement's
 * name. Handlers without checks (`@Idempotent`,
 * `IdempotencyService.run()`), and every handler on a table without the columns, keep the
 * statements of claim.sql.ts, unchanged.
 */
import type { ClaimTable } from './claim-table.js';
import { claimStatements, DURABLE_COMMIT, statementName, type ClaimStatements } from './claim.sql.js';
import type { ClaimStatement } from './statement-executor.js';

/** The checked statements for `table`. */
export function checkedClaimStatements(table: ClaimTable): ClaimStatements {
  const t = table.sql;
  const named = (role: string, text: string): ClaimStatement => ({ name: statementName(role, text), text });
  return {
    ...claimStatements(table),
    // As transactionClaim, storing $5 (the fingerprint) with the claim, and answering a claim that
    // was not inserted with the row's fingerprint and stored response beside its status: a replay
    // is answered from this one statement, as before. One row read (the LEFT JOIN), not three.
    transactionClaim: named(
      'transaction_claim',
      `
WITH bound AS (
  SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', $4, true) AS applied,
         ${DURABLE_COMMIT} AS durable
), claim AS (
  INSERT INTO ${t} (scope, event_key, source, status, completed_at, fingerprint)
  SELECT $1, $2, $3, 'done', now(), $5 FROM bound
  ON CONFLICT (scope, event_key) DO NOTHING
  RETURNING (SELECT set_config('lock_timeout', previous, true) FROM bound) AS lock_timeout
)
SELECT EXISTS (SELECT 1 FROM claim) AS claimed, found.status, found.fingerprint, found.response,
       (SELECT previous FROM bound) AS previous
FROM (SELECT 1) AS one
LEFT JOIN ${t} AS found
  ON found.scope = $1 AND found.event_key = $2 AND NOT EXISTS (SELECT 1 FROM claim)`,
    ),
    // The reclaim takes the new delivery's fingerprint ($5) and forgets any response: the claim
    // is this delivery's now.
    transactionReclaim: named(
      'transaction_reclaim',
      `
WITH bound AS (SELECT set_config('lock_timeout', $3, true) AS applied)
UPDATE ${t} AS pe SET
  status = 'done',
  attempts = pe.attempts + 1,
  lease_token = NULL,
  claimed_at = now(),
  lease_expires_at = NULL,
  completed_at = now(),
  last_error = NULL,
  fingerprint = $5,
  response = NULL
FROM bound
WHERE pe.scope = $1 AND pe.event_key = $2
  AND (pe.status = 'failed' OR (pe.status = 'in_progress' AND pe.lease_expires_at <= now()))
RETURNING set_config('lock_timeout', $4, true) AS lock_timeout`,
    ),
    // A failure keeps the fingerprint ($6) of the delivery that failed, so that its retry with
    // another payload is told apart.
    transactionFailure: named(
      'transaction_failure',
      `
WITH bound AS (SELECT set_config('lock_timeout', $5, true) AS applied)
INSERT INTO ${t} AS pe (scope, event_key, source, status, attempts, last_error, fingerprint)
SELECT $1, $2, $3, 'failed', 1, $4, $6 FROM bound
ON CONFLICT (scope, event_key) DO UPDATE SET
  attempts = pe.attempts + 1,
  claimed_at = now(),
  last_error = EXCLUDED.last_error,
  fingerprint = EXCLUDED.fingerprint
WHERE pe.status = 'failed'`,
    ),
    // As leaseClaim, with $7 the fingerprint. With $8 true (conflicts refused), a failed claim or
    // an expired lease of another fingerprint is not taken over: nothing is claimed, claimState
    // shows why, and the delivery is refused without running.
    leaseClaim: named(
      'lease_claim',
      `
WITH bound AS (SELECT set_config('lock_timeout', $6, true) AS applied)
INSERT INTO ${t} AS pe
  (scope, event_key, source, status, attempts, lease_token, claimed_at, lease_expires_at, fingerprint)
SELECT $1, $2, $3, 'in_progress', 1, $4, now(), now() + $5::double precision * interval '1 millisecond', $7
FROM bound
ON CONFLICT (scope, event_key) DO UPDATE SET
  status = 'in_progress',
  attempts = CASE WHEN pe.lease_token = EXCLUDED.lease_token THEN pe.attempts ELSE pe.attempts + 1 END,
  lease_token = EXCLUDED.lease_token,
  claimed_at = EXCLUDED.claimed_at,
  lease_expires_at = EXCLUDED.lease_expires_at,
  completed_at = NULL,
  last_error = NULL,
  fingerprint = EXCLUDED.fingerprint,
  response = NULL
WHERE ((pe.status = 'in_progress' AND pe.lease_expires_at <= EXCLUDED.claimed_at)
   OR pe.status = 'failed'
   OR (pe.status = 'in_progress' AND pe.lease_token = EXCLUDED.lease_token))
  AND (NOT $8::boolean OR pe.lease_token = EXCLUDED.lease_token OR pe.fingerprint IS NULL
       OR EXCLUDED.fingerprint IS NULL OR pe.fingerprint = EXCLUDED.fingerprint)
RETURNING true AS claimed, pe.attempts`,
    ),
    claimState: named(
      'claim_state',
      `
SELECT status, attempts, lease_token, lease_expires_at > now() AS live,
       GREATEST(1, CEIL(EXTRACT(EPOCH FROM (lease_expires_at - now()))))::int AS seconds_left,
       GREATEST(0, EXTRACT(EPOCH FROM (now() - claimed_at)) * 1000)::double precision AS held_ms,
       fingerprint, response
FROM ${t} WHERE scope = $1 AND event_key = $2`,
    ),
    // The fenced completion writes the response ($4) in the same UPDATE: the claim is never done
    // without it, and no response exists for a claim that is not done.
    leaseComplete: named(
      'lease_complete',
      `
WITH durable AS (SELECT ${DURABLE_COMMIT} AS applied)
UPDATE ${t} SET status = 'done', completed_at = now(), response = $4
FROM durable
WHERE scope = $1 AND event_key = $2 AND lease_token = $3 AND status = 'in_progress'`,
    ),
    // Sent with the COMMIT (beforeCommit): the row is this transaction's own (inserted or
    // reclaimed by it, and locked), so it always matches.
    storeResponse: named(
      'store_response',
      `UPDATE ${t} SET response = $3 WHERE scope = $1 AND event_key = $2`,
    ),
  };
}
