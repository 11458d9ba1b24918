import { DEFAULTS } from '../../lib/idempotency.constants.js';
import { claimTable } from '../../lib/postgres/claim-table.js';
import { claimStatements, prepareTransactionClaimSql } from '../../lib/postgres/claim.sql.js';
import { maintenanceStatements } from '../../lib/postgres/maintenance.sql.js';
import type { ClaimStatement } from '../../lib/postgres/statement-executor.js';

/**
 * The statements `@IdempotentWebhook` handlers send on the default claims table (migrated, so
 * with key checks: claimStatements' `checked`), for tests that look for them on the wire.
 */
export const CLAIM_SQL = claimStatements(claimTable(undefined), true);

/** The statements of handlers without key checks (`@Idempotent`, `IdempotencyService.run()`). */
export const UNCHECKED_CLAIM_SQL = claimStatements(claimTable(undefined));

/** The default table's maintenance statements, for a module with this `retentionBatchSize`. */
export const maintenanceSql = (retentionBatchSize: number = DEFAULTS.retentionBatchSize) =>
  maintenanceStatements(claimTable(undefined), { retentionBatchSize });

/** The default table's SQL-level PREPARE of the transaction claim. */
export const PREPARE_TRANSACTION_CLAIM = prepareTransactionClaimSql(CLAIM_SQL, 5);

/**
 * The names the given statements of the default table leave on a session once prepared, each with
 * its companions (ClaimStatement.companions), sorted as pg_prepared_statements lists them.
 */
export function statementNames(...roles: (keyof Omit<typeof CLAIM_SQL, 'table'>)[]): string[] {
  return roles
    .flatMap((role) => {
      const { name, companions = [] } = CLAIM_SQL[role] as ClaimStatement;
      return [name, ...companions.map((companion) => companion.name)];
    })
    .sort();
}
