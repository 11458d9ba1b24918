import type { DataSource } from 'typeorm';
import type { VersionTable } from './version-table.js';

const versionTableMissing = (table: string, handlers: string[]) =>
  `IdempotencyModule cannot start: ${handlers.join(', ')} ${handlers.length === 1 ? 'has' : 'have'} an ordering guard (order), but its versions table ${table} does not exist. Run the library's migrations (processedEventsMigrations(), or processedEventsMigrations({ schema, table }) for a table of your own, adds it), or check the schema and table options`;

const versionTableMismatch = (table: string, problems: string[]) =>
  `IdempotencyModule cannot start: the versions table ${table} is not the one its migration creates (${problems.join('; ')}). Run the library's migrations, or point the schema and table options at the right table`;

/** The columns the ordered claim and retention rely on, with the type each must have. */
const EXPECTED_COLUMNS: Record<string, string> = {
  scope: 'character varying',
  entity: 'text',
  version: 'numeric',
  applied_at: 'timestamp with time zone',
};

/**
 * Fails the boot when a handler has an ordering guard and the versions table is missing or not
 * the migration's, naming the handlers and the migration: otherwise each of their deliveries would
 * be answered 503 as if the database were down, and the sender would retry forever. A module
 * whose handlers have no guard never needs the table, so none is checked for then.
 */
export async function assertVersionTable(
  dataSource: DataSource,
  table: VersionTable,
  handlers: string[],
): Promise<void> {
  const [found] = await dataSource.query(`SELECT to_regclass($1)::text AS name`, [table.regclass]);
  if (!found?.name) throw new Error(versionTableMissing(table.sql, handlers));
  const columns: { name: string; type: string }[] = await dataSource.query(
    `SELECT attname AS name, format_type(atttypid, NULL) AS type FROM pg_attribute
     WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`,
    [table.regclass],
  );
  const types = new Map(columns.map((column) => [column.name, column.type]));
  const wrong = Object.entries(EXPECTED_COLUMNS)
    .filter(([name, type]) => types.get(name) !== type)
    .map(
      ([name, type]) => `${name} ${types.has(name) ? `is ${types.get(name)}, not ${type}` : 'is missing'}`,
    );
  // ON CONFLICT (scope, entity) needs exactly that unique index.
  const [key] = await dataSource.query(
    `SELECT array_agg(a.attname::text ORDER BY a.attname) AS columns FROM pg_index i
     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
     WHERE i.indrelid = to_regclass($1) AND i.indisprimary`,
    [table.regclass],
  );
  const primary = (key?.columns as string[] | null) ?? [];
  if (primary.join(',') !== 'entity,scope') wrong.push('its primary key is not (scope, entity)');
  if (wrong.length > 0) throw new Error(versionTableMismatch(table.sql, wrong));
}
