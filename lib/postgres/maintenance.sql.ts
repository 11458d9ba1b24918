/**
 * The statements of the expired-lease reporter and retention: run once a tick by one replica, so
 * they are sent unnamed through TypeORM. Parameters are positional; times come from the database
 * clock.
 */

/**
 * The reporter claims its tick (the database clock divided into `reportEveryMs` slots) in the
 * claims table itself, so with many replicas exactly one reports per tick.
 * $1 reporter scope, $2 interval ms.
 */
export const REPORTER_TICK_CLAIM = `
INSERT INTO processed_events (scope, event_key, source, status, completed_at)
VALUES ($1, FLOOR(EXTRACT(EPOCH FROM now()) * 1000 / $2::double precision)::bigint::text, 'idempotency', 'done', now())
ON CONFLICT (scope, event_key) DO NOTHING
RETURNING event_key`;

/** Old tick claims are only noise. $1 reporter scope. */
export const REPORTER_TICKS_PRUNE = `
DELETE FROM processed_events WHERE scope = $1 AND completed_at < now() - interval '1 day'`;

/** Leases whose worker died holding them, oldest first, with the full count. $1 limit. */
export const EXPIRED_LEASES = `
SELECT scope, event_key, source, attempts, claimed_at, lease_expires_at,
       (EXTRACT(EPOCH FROM (now() - lease_expires_at)) * 1000)::bigint AS expired_for_ms,
       COUNT(*) OVER () AS total
FROM processed_events
WHERE status = 'in_progress' AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT $1`;

/**
 * How many leases have expired, for the gauge of a replica whose run was skipped (another replica
 * reported the tick): every replica exports the gauge, so each keeps it current.
 */
export const EXPIRED_LEASE_COUNT = `
SELECT COUNT(*)::int AS total FROM processed_events WHERE status = 'in_progress' AND lease_expires_at < now()`;

/** Claims that keep failing or dying. $1 max attempts, $2 reporter scope, $3 limit. */
export const POISON_EVENTS = `
SELECT scope, event_key, source, status, attempts, last_error
FROM processed_events
WHERE status <> 'done' AND attempts >= $1 AND scope <> $2
ORDER BY attempts DESC
LIMIT $3`;

/**
 * One retention batch: done rows only, never in_progress or failed. Joined on the primary key
 * rather than ctid, so it also runs on distributed tables (Citus). $1 days, $2 batch size.
 */
export const RETENTION_BATCH = `
DELETE FROM processed_events AS pe
USING (
  SELECT scope, event_key FROM processed_events
  WHERE status = 'done' AND completed_at < now() - $1::double precision * interval '1 day'
  LIMIT $2
) AS old
WHERE pe.scope = old.scope AND pe.event_key = old.event_key AND pe.status = 'done'`;
