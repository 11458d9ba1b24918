import type { TestDatabase } from './database.js';

/**
 * A `processed_events` row as the external-mode tests read it. Its times are microseconds since
 * the epoch, as bigint: the database keeps microseconds, and read into a JS Date they would be
 * cut to milliseconds, so two times within one millisecond (a claim and its extension on a fast
 * path) would compare equal, and a change within one would go unseen.
 */
export interface ClaimRow {
  scope: string;
  event_key: string;
  source: string;
  status: 'in_progress' | 'done' | 'failed';
  attempts: number;
  lease_token: string | null;
  claimed_at: bigint;
  lease_expires_at: bigint | null;
  completed_at: bigint | null;
  last_error: string | null;
}

/**
 * Microseconds since the epoch of a timestamptz column, as text. Whole seconds and microseconds
 * apart: before PostgreSQL 14 EXTRACT returns double precision, whose 15-16 digits cannot hold
 * today's epoch in microseconds exactly.
 */
const micros = (column: string) =>
  `(EXTRACT(EPOCH FROM date_trunc('second', ${column}))::bigint * 1000000
    + EXTRACT(MICROSECONDS FROM ${column})::bigint % 1000000)::text AS ${column}`;

const CLAIM_ROW = `
SELECT scope, event_key, source, status, attempts, lease_token,
       ${micros('claimed_at')}, ${micros('lease_expires_at')}, ${micros('completed_at')}, last_error
FROM processed_events WHERE scope = $1 AND event_key = $2`;

/** The text pg returns for the bigint columns, before they become bigint. */
type RawClaimRow = Omit<ClaimRow, 'claimed_at' | 'lease_expires_at' | 'completed_at'> & {
  claimed_at: string;
  lease_expires_at: string | null;
  completed_at: string | null;
};

const bigintOrNull = (value: string | null) => (value === null ? null : BigInt(value));

/** The claim of `key` under `scope`, or undefined. */
export async function claimRow(db: TestDatabase, scope: string, key: string): Promise<ClaimRow | undefined> {
  const { rows } = await db.pool.query<RawClaimRow>(CLAIM_ROW, [scope, key]);
  const row = rows[0];
  if (!row) return undefined;
  return {
    ...row,
    claimed_at: BigInt(row.claimed_at),
    lease_expires_at: bigintOrNull(row.lease_expires_at),
    completed_at: bigintOrNull(row.completed_at),
  };
}

/**
 * True once the lease of `key` has run out by the database clock, the clock the library compares
 * leases with (Node's may differ).
 */
export async function leaseExpired(db: TestDatabase, scope: string, key: string): Promise<boolean> {
  const { rows } = await db.pool.query<{ expired: boolean }>(
    'SELECT lease_expires_at <= now() AS expired FROM processed_events WHERE scope = $1 AND event_key = $2',
    [scope, key],
  );
  return rows[0]?.expired === true;
}

/** Side effects recorded for `key` (one `downstream_calls` row per call), in call order. */
export async function downstreamCalls(db: TestDatabase, key: string): Promise<{ attempt: number | null }[]> {
  const { rows } = await db.pool.query<{ attempt: number | null }>(
    'SELECT attempt FROM downstream_calls WHERE event_id = $1 ORDER BY id',
    [key],
  );
  return rows;
}
