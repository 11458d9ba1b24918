import type { TestDatabase } from './database.js';

/** A `processed_events` row as the external-mode tests read it. */
export interface ClaimRow {
  scope: string;
  event_key: string;
  status: 'in_progress' | 'done' | 'failed';
  attempts: number;
  lease_token: string | null;
  claimed_at: Date;
  lease_expires_at: Date | null;
  completed_at: Date | null;
  last_error: string | null;
}

/** The claim of `key` under `scope`, or undefined. */
export async function claimRow(db: TestDatabase, scope: string, key: string): Promise<ClaimRow | undefined> {
  const { rows } = await db.pool.query<ClaimRow>(
    'SELECT * FROM processed_events WHERE scope = $1 AND event_key = $2',
    [scope, key],
  );
  return rows[0];
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
