/**
 * Every statement a delivery sends, in one place (the reporter's are in maintenance.sql.ts).
 * Parameters are positional; times come from the database clock (`now()`), never Node's, so
 * replicas with skewed clocks agree on lease expiry. They are named: pg prepares each once per
 * connection, and Postgres then skips parsing and planning them (see `preparedStatements`).
 */
import type { ClaimStatement } from './statement-executor.js';

/**
 * Transaction mode claim. The CTE bounds how long a concurrent duplicate waits on the first
 * delivery's uncommitted claim (`lock_timeout`, SQLSTATE 55P03 when it runs out) without a separate
 * `SET LOCAL` round trip, and RETURNING restores the previous value once the claim is ours, so the
 * handler's own statements are not bound by it. Rows commit as `done`: the commit is the completion.
 * $1 scope, $2 key, $3 source, $4 lock_timeout ('5000ms').
 */
export const TRANSACTION_CLAIM: ClaimStatement = {
  name: 'idempotency_transaction_claim',
  text: `
WITH bound AS (
  SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', $4, true) AS applied
)
INSERT INTO processed_events (scope, event_key, source, status, completed_at)
SELECT $1, $2, $3, 'done', now() FROM bound
ON CONFLICT (scope, event_key) DO NOTHING
RETURNING (SELECT set_config('lock_timeout', previous, true) FROM bound) AS lock_timeout`,
};

/**
 * The transaction claim as a SQL-level prepared statement, so that BEGIN and the claim can travel
 * in one simple-protocol query (`beginAndClaim`). Prepared once per connection.
 */
export const PREPARE_TRANSACTION_CLAIM = `PREPARE ${TRANSACTION_CLAIM.name} (text, text, text, text) AS${TRANSACTION_CLAIM.text}`;

/**
 * BEGIN and the prepared transaction claim (preceded by its PREPARE on a connection that has not
 * run it) as one simple-protocol query: one round trip. The simple protocol takes no parameters,
 * so the four values come as literals, already escaped by pg's `escapeLiteral`.
 */
export function beginAndClaimSql(
  literals: readonly string[],
  prepare: boolean,
  isolationLevel?: string,
): string {
  const begin = isolationLevel ? `BEGIN ISOLATION LEVEL ${isolationLevel}` : 'BEGIN';
  const execute = `EXECUTE ${TRANSACTION_CLAIM.name} (${literals.join(', ')})`;
  return prepare ? `${begin}; ${PREPARE_TRANSACTION_CLAIM}; ${execute}` : `${begin}; ${execute}`;
}

/**
 * External mode claim: new key → in_progress; expired in_progress or failed → re-claimed with a
 * new token and attempts + 1; anything else → no row. Clock functions stay in VALUES and the
 * WHERE compares plain columns (EXCLUDED.claimed_at), so the statement also runs on Citus.
 * $1 scope, $2 key, $3 source, $4 lease token, $5 lease ms.
 */
export const LEASE_CLAIM: ClaimStatement = {
  name: 'idempotency_lease_claim',
  text: `
INSERT INTO processed_events AS pe
  (scope, event_key, source, status, attempts, lease_token, claimed_at, lease_expires_at)
VALUES ($1, $2, $3, 'in_progress', 1, $4, now(), now() + $5::double precision * interval '1 millisecond')
ON CONFLICT (scope, event_key) DO UPDATE SET
  status = 'in_progress',
  attempts = pe.attempts + 1,
  lease_token = EXCLUDED.lease_token,
  claimed_at = EXCLUDED.claimed_at,
  lease_expires_at = EXCLUDED.lease_expires_at,
  completed_at = NULL,
  last_error = NULL
WHERE (pe.status = 'in_progress' AND pe.lease_expires_at <= EXCLUDED.claimed_at)
   OR pe.status = 'failed'
RETURNING pe.attempts`,
};

/**
 * Why a lease claim returned no row: done, or a live lease (and how long it has left, in whole
 * seconds, at least 1). $1 scope, $2 key.
 */
export const CLAIM_STATE: ClaimStatement = {
  name: 'idempotency_claim_state',
  text: `
SELECT status, attempts, lease_expires_at > now() AS live,
       GREATEST(1, CEIL(EXTRACT(EPOCH FROM (lease_expires_at - now()))))::int AS seconds_left
FROM processed_events WHERE scope = $1 AND event_key = $2`,
};

/** Fenced completion: only the holder of the current token marks the event done. $1 scope, $2 key, $3 token. */
export const LEASE_COMPLETE: ClaimStatement = {
  name: 'idempotency_lease_complete',
  text: `
UPDATE processed_events SET status = 'done', completed_at = now()
WHERE scope = $1 AND event_key = $2 AND lease_token = $3 AND status = 'in_progress'`,
};

/** Fenced release after a failure: the next delivery re-claims at once. $1 scope, $2 key, $3 token, $4 error. */
export const LEASE_FAIL: ClaimStatement = {
  name: 'idempotency_lease_fail',
  text: `
UPDATE processed_events SET status = 'failed', last_error = $4
WHERE scope = $1 AND event_key = $2 AND lease_token = $3 AND status = 'in_progress'`,
};

/** Fenced renewal. $1 scope, $2 key, $3 token, $4 lease ms. */
export const LEASE_EXTEND: ClaimStatement = {
  name: 'idempotency_lease_extend',
  text: `
UPDATE processed_events SET lease_expires_at = now() + $4::double precision * interval '1 millisecond'
WHERE scope = $1 AND event_key = $2 AND lease_token = $3 AND status = 'in_progress'`,
};

/**
 * For `expireLease()` in tests: ends an in-progress lease now, as if its worker had died.
 * $1 scope, $2 key.
 */
export const EXPIRE_LEASE: ClaimStatement = {
  name: 'idempotency_expire_lease',
  text: `
UPDATE processed_events SET lease_expires_at = now()
WHERE scope = $1 AND event_key = $2 AND status = 'in_progress'`,
};

/** The current attempt number of a claim, for the lease-lost log. $1 scope, $2 key. */
export const CURRENT_ATTEMPT: ClaimStatement = {
  name: 'idempotency_current_attempt',
  text: `SELECT attempts FROM processed_events WHERE scope = $1 AND event_key = $2`,
};
