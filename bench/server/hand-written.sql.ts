/**
 * The SQL a careful developer writes by hand from the seed article, against the library's own
 * `processed_events` table so both sides touch the same rows and indexes. Every variant does the
 * same business write: ORDER_INSERT.
 */

/** The business write every variant makes. $1 event id, $2 variant, $3 type, $4 amount, $5 currency, $6 customer. */
export const ORDER_INSERT = `INSERT INTO orders (event_id, variant, type, amount, currency, customer) VALUES ($1, $2, $3, $4, $5, $6)`;

/**
 * Seed fix one (and the naive snippet, autocommitted): the claim is the row, committed as done.
 * Same columns the library's transaction claim writes. $1 scope, $2 key, $3 source.
 */
export const RAW_CLAIM = `
INSERT INTO processed_events (scope, event_key, source, status, completed_at)
VALUES ($1, $2, $3, 'done', now())
ON CONFLICT (scope, event_key) DO NOTHING
RETURNING event_key`;

/**
 * Request mode by hand: the claim with the request's fingerprint. $1 scope, $2 key, $3 source,
 * $4 fingerprint.
 */
export const RAW_REQUEST_CLAIM = `
INSERT INTO processed_events (scope, event_key, source, status, completed_at, fingerprint)
VALUES ($1, $2, $3, 'done', now(), $4)
ON CONFLICT (scope, event_key) DO NOTHING
RETURNING event_key`;

/** Request mode by hand, when the claim returned nothing: what to replay. $1 scope, $2 key. */
export const RAW_REQUEST_STORED = `SELECT fingerprint, response FROM processed_events WHERE scope = $1 AND event_key = $2`;

/** Request mode by hand: the response, before the COMMIT. $1 scope, $2 key, $3 response. */
export const RAW_REQUEST_STORE = `UPDATE processed_events SET response = $3 WHERE scope = $1 AND event_key = $2`;

/** Seed fix two: take a new key, or one whose worker has clearly died. $1 scope, $2 key, $3 source. */
export const RAW_LEASE_CLAIM = `
INSERT INTO processed_events AS pe (scope, event_key, source, status, claimed_at)
VALUES ($1, $2, $3, 'in_progress', now())
ON CONFLICT (scope, event_key) DO UPDATE SET status = 'in_progress', claimed_at = now()
WHERE pe.status = 'in_progress' AND pe.claimed_at < now() - interval '5 minutes'
RETURNING event_key`;

/** Seed fix two, when the claim returned nothing: done (200) or someone else's (503). $1 scope, $2 key. */
export const RAW_LEASE_STATE = `SELECT status FROM processed_events WHERE scope = $1 AND event_key = $2`;

/** Seed fix two: the only thing that tells future retries to skip. $1 scope, $2 key. */
export const RAW_LEASE_DONE = `
UPDATE processed_events SET status = 'done', completed_at = now()
WHERE scope = $1 AND event_key = $2`;

/** The bench's own table, beside the library's migration. */
export const BENCH_SCHEMA = `
CREATE TABLE IF NOT EXISTS orders (
  id         bigserial PRIMARY KEY,
  event_id   text        NOT NULL,
  variant    text        NOT NULL,
  type       text        NOT NULL,
  amount     integer     NOT NULL,
  currency   text        NOT NULL,
  customer   text        NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS orders_event_id_idx ON orders (event_id)`;
