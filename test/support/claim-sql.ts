import { claimTable } from '../../lib/postgres/claim-table.js';
import { claimStatements, prepareTransactionClaimSql } from '../../lib/postgres/claim.sql.js';
import { maintenanceStatements } from '../../lib/postgres/maintenance.sql.js';

/** The statements of the default claims table, for tests that look for them on the wire. */
export const CLAIM_SQL = claimStatements(claimTable(undefined));

/** The default table's maintenance statements. */
export const MAINTENANCE_SQL = maintenanceStatements(claimTable(undefined));

/** The default table's SQL-level PREPARE of the transaction claim. */
export const PREPARE_TRANSACTION_CLAIM = prepareTransactionClaimSql(CLAIM_SQL);
