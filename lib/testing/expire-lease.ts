import type { DataSource } from 'typeorm';
import { claimTable } from '../postgres/claim-table.js';
import { claimStatements } from '../postgres/claim.sql.js';
import { claimQuery } from '../postgres/statement-executor.js';
import { pgPoolOf } from '../postgres/typeorm-internals.js';

/**
 * Ends the lease of an external-mode claim now, as if the worker holding it had died, so a test of
 * what follows a crash need not wait out `leaseMs`: the next delivery of the key re-claims it
 * (attempt + 1), and the reporter sees it expired until then. A handler still running under that
 * lease finds it lost once another delivery has re-claimed the event (its completion or failure
 * changes nothing and counts `lease_lost`); before that, its heartbeat or `extendLease()` brings
 * the lease back, as for any slow worker. Resolves false, changing nothing, when the key has no
 * in-progress claim under `scope` (done, failed, or never claimed). `table` names the claims table
 * when the module's `schema` or `table` option moved it.
 */
export async function expireLease(
  dataSource: DataSource,
  scope: string,
  key: string,
  table: { schema?: string; table?: string } = {},
): Promise<boolean> {
  const schema = table.schema ?? (dataSource.options as { schema?: string }).schema;
  const { expireLease: statement } = claimStatements(claimTable(schema, table.table));
  // Unnamed: a test helper has no plan worth keeping on the app's connections.
  const result = await pgPoolOf(dataSource).query(claimQuery(statement, [scope, key], false));
  return result.rowCount === 1;
}
