import { Inject, Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import type { DataSource } from 'typeorm';
import { IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import { claimTable, type ClaimTable } from './claim-table.js';
import { claimStatements, type ClaimStatements } from './claim.sql.js';
import { maintenanceStatements, type MaintenanceStatements } from './maintenance.sql.js';
import { orderedClaimStatements, type OrderedClaimStatements } from './ordered-claim.sql.js';
import {
  versionMaintenanceStatements,
  type VersionMaintenanceStatements,
} from './version-maintenance.sql.js';
import { versionTable, type VersionTable } from './version-table.js';
import { PreparedStatements } from './prepared-statements.js';
import { watchOutsideWrites } from './outside-write.subscriber.js';
import { StatementExecutor } from './statement-executor.js';
import { assertTypeOrmInternals, listenForEarlyErrors } from './typeorm-internals.js';

const claimTableMissing = (table: string) =>
  `IdempotencyModule cannot start: the claims table ${table} does not exist. Run the library's migrations (migrations: [...processedEventsMigrations()], or processedEventsMigrations({ schema, table }) for a table of your own), or check the schema and table options`;

const claimTableMismatch = (table: string, problems: string[]) =>
  `IdempotencyModule cannot start: the claims table ${table} is not the one its migrations create (${problems.join('; ')}). Run the library's migrations, or point the schema and table options at the right table`;

const unfinishedIndexMissing = (table: string) =>
  `The claims table ${table} has no index on unfinished claims: the reporter's poison query reads the whole table. Run the library's migrations (processedEventsMigrations() adds it)`;

const failedIndexMissing = (table: string) =>
  `The claims table ${table} has no index on failed claims: retention walks every unfinished claim to find the old failed ones. Run the library's migrations (processedEventsMigrations() adds it)`;

const storedColumnsMissing = (table: string) =>
  `The claims table ${table} has no fingerprint and response columns: the key checks of @IdempotentWebhook (key_conflict) and the stored replies of @MessagePattern are off, and @IdempotentRequest routes cannot start. Run the library's migrations (processedEventsMigrations() adds them: AddStoredResponses1765584000000)`;

/** Refused at boot: a request-mode route needs the stored responses. */
export const storedColumnsRequired = (table: string, routes: readonly string[]) =>
  `IdempotencyModule cannot start: ${routes.join(', ')} ${routes.length === 1 ? 'stores its responses' : 'store their responses'} in the claims table ${table}, which has no fingerprint and response columns. Run the library's migrations (processedEventsMigrations(), or processedEventsMigrations({ schema, table }), adds them: AddStoredResponses1765584000000)`;

/** The columns of key checks and stored responses (migration 1765584000000), and their types. */
const STORED_COLUMNS: Record<string, string> = { fingerprint: 'text', response: 'jsonb' };

/** The columns every statement relies on, with the type each must have. */
const EXPECTED_COLUMNS: Record<string, string> = {
  scope: 'character varying',
  event_key: 'text',
  source: 'character varying',
  status: 'character varying',
  attempts: 'integer',
  lease_token: 'uuid',
  claimed_at: 'timestamp with time zone',
  lease_expires_at: 'timestamp with time zone',
  completed_at: 'timestamp with time zone',
  last_error: 'text',
};

/**
 * The claims table as this module sees it: its name (the `schema` and `table` options, the
 * DataSource's `schema` by default), its statements, whether they are prepared, and the executor
 * that sends them. One per module, shared by the strategies and the reporter.
 */
@Injectable()
export class ClaimDatabase implements OnModuleInit {
  private readonly logger = new Logger('IdempotencyModule');
  readonly table: ClaimTable;
  readonly statements: ClaimStatements;
  /** The statements of handlers with key checks (claimStatements' `checked`). */
  readonly checkedStatements: ClaimStatements;
  readonly maintenance: MaintenanceStatements;
  readonly prepared: PreparedStatements;
  readonly executor: StatementExecutor;
  /** The ordering guard's versions table, its claims and its retention (docs/ordering.md). */
  readonly versions: VersionTable;
  readonly ordered: OrderedClaimStatements;
  /** The ordered claims of handlers with key checks (the fingerprint stored, a found one answered). */
  readonly checkedOrdered: OrderedClaimStatements;
  readonly versionMaintenance: VersionMaintenanceStatements;

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) readonly dataSource: DataSource,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
  ) {
    const schema = config.schema ?? (dataSource.options as { schema?: string }).schema;
    this.table = claimTable(schema, config.table);
    this.statements = claimStatements(this.table);
    this.checkedStatements = claimStatements(this.table, true);
    this.maintenance = maintenanceStatements(this.table, config);
    this.prepared = new PreparedStatements(config.preparedStatements, this.logger);
    this.executor = new StatementExecutor(dataSource, this.prepared);
    this.versions = versionTable(this.table);
    this.ordered = orderedClaimStatements(this.table, this.versions);
    this.checkedOrdered = orderedClaimStatements(
      this.table,
      this.versions,
      true,
      this.checkedStatements.storeResponse,
    );
    this.versionMaintenance = versionMaintenanceStatements(this.versions, config);
  }

  /**
   * Fails the boot, rather than every delivery, when TypeORM moved what the claim path relies on
   * or the claims table is missing or not the migration's; keeps a session terminated as it
   * starts from ending the process (listenForEarlyErrors); and watches for writes made outside
   * a claim's transaction (OutsideWriteSubscriber).
   */
  async onModuleInit(): Promise<void> {
    assertTypeOrmInternals(this.dataSource);
    listenForEarlyErrors(this.dataSource);
    await this.checkTable();
    await watchOutsideWrites(this.dataSource, this.config.strictTransactions, this.logger);
  }

  /**
   * Fails the boot when the table is missing or lacks what the statements need (a migration not
   * run, a `schema` pointing elsewhere), naming the table and the migration, instead of answering
   * every delivery 503 as if the database were down: a sender would retry forever.
   */
  async checkTable(): Promise<void> {
    this.columnsChecked ??= this.readTable();
    await this.columnsChecked;
  }

  /**
   * True once the boot check found the columns of key checks and stored responses (migration
   * 1765584000000): until then, and on a table without them, every handler claims with the
   * statements of claim.sql.ts, as before the migration.
   */
  get keyChecks(): boolean {
    return this.storedColumns;
  }

  /**
   * Fails the boot when handlers that store their responses (`routes`, named) meet a table
   * without the columns: a request-mode route that cannot replay would run a retry twice.
   */
  async requireStoredColumns(routes: readonly string[]): Promise<void> {
    if (routes.length === 0) return;
    await this.checkTable();
    if (!this.storedColumns) throw new Error(storedColumnsRequired(this.table.sql, routes));
  }

  /** Whether the table has the stored-response columns (set by the boot check). */
  private storedColumns = false;
  /** The boot check, once, for whichever boot check asks first (this module's, the explorer's). */
  private columnsChecked?: Promise<void>;

  private async readTable(): Promise<void> {
    const [found] = await this.dataSource.query(`SELECT to_regclass($1)::text AS name`, [
      this.table.regclass,
    ]);
    if (!found?.name) throw new Error(claimTableMissing(this.table.sql));
    const columns: { name: string; type: string }[] = await this.dataSource.query(
      `SELECT attname AS name, format_type(atttypid, NULL) AS type FROM pg_attribute
       WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`,
      [this.table.regclass],
    );
    const types = new Map(columns.map((column) => [column.name, column.type]));
    const wrong = Object.entries(EXPECTED_COLUMNS)
      .filter(([name, type]) => types.get(name) !== type)
      .map(
        ([name, type]) => `${name} ${types.has(name) ? `is ${types.get(name)}, not ${type}` : 'is missing'}`,
      );
    const [key] = await this.dataSource.query(
      `SELECT array_agg(a.attname::text ORDER BY a.attname) AS columns FROM pg_index i
       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
       WHERE i.indrelid = to_regclass($1) AND i.indisprimary`,
      [this.table.regclass],
    );
    const primary = (key?.columns as string[] | null) ?? [];
    if (primary.join(',') !== 'event_key,scope') wrong.push('its primary key is not (scope, event_key)');
    // Key checks and stored responses: absent, the handlers keep the statements they had before
    // (a warning; a request-mode route fails the boot, see requireStoredColumns); of the wrong
    // type, the table is not the migration's.
    const stored = Object.entries(STORED_COLUMNS).filter(([name]) => types.has(name));
    for (const [name, type] of stored) {
      if (types.get(name) !== type) wrong.push(`${name} is ${types.get(name)}, not ${type}`);
    }
    if (wrong.length > 0) throw new Error(claimTableMismatch(this.table.sql, wrong));
    this.storedColumns = stored.length === Object.keys(STORED_COLUMNS).length;
    if (!this.storedColumns) this.logger.warn(storedColumnsMissing(this.table.sql));

    // Only the reporter needs the later migrations' indexes (poison query, retention of failed
    // claims): warn, the claims work without them. Found by what they index, whatever their name.
    const predicates: { predicate: string }[] = await this.dataSource.query(
      `SELECT pg_get_expr(i.indpred, i.indrelid) AS predicate FROM pg_index i
       WHERE i.indrelid = to_regclass($1) AND i.indpred IS NOT NULL`,
      [this.table.regclass],
    );
    const has = (pattern: RegExp) => predicates.some(({ predicate }) => pattern.test(predicate));
    if (!has(/status.*<>.*'done'/)) this.logger.warn(unfinishedIndexMissing(this.table.sql));
    if (!has(/status.*=.*'failed'/)) this.logger.warn(failedIndexMissing(this.table.sql));
  }
}
