import type { DataSource } from 'typeorm';
import { PROCESSED_EVENTS_TABLE } from '../idempotency.constants.js';

/**
 * Ends the lease of an external-mode claim now, as if the worker holding it had died: the next
 * delivery of the key re-claims it (attempt + 1), the worker still holding it finds its lease lost
 * when it finishes, and the expired-lease reporter sees it. For tests of what happens after a
 * crash, without waiting out `leaseMs`. Resolves false, changing nothing, when the key has no
 * in-progress claim under `scope` (done, failed, or never claimed).
 */
export async function expireLease(dataSource: DataSource, scope: string, key: string): Promise<boolean> {
  // TypeORM answers an UPDATE on postgres with [rows, rowCount].
  const [, updated] = (await dataSource.query(
    `UPDATE ${PROCESSED_EVENTS_TABLE} SET lease_expires_at = now()
     WHERE scope = $1 AND event_key = $2 AND status = 'in_progress'`,
    [scope, key],
  )) as [unknown, number];
  return updated === 1;
}
