import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { idempotencyEntities, processedEventsMigrations } from '../../lib/index.js';

/** A claims table an app may configure: the default, and one in a schema of its own. */
interface TableCase {
  label: string;
  options: { schema?: string; table?: string };
  /** What the catalog calls the table, for `::regclass` and pg_indexes. */
  regclass: string;
  schema: string;
  table: string;
  /** The migrations' names as TypeORM records them. */
  migrationNames: string[];
  /** How TypeORM names the table in its CREATE TABLE. */
  created: string;
}

const CASES: TableCase[] = [
  {
    label: 'the default processed_events',
    options: {},
    regclass: 'public.processed_events',
    schema: 'public',
    table: 'processed_events',
    migrationNames: [
      'CreateProcessedEvents1764547200000',
      'AddUnfinishedClaimsIndex1764892800000',
      'AddFailedClaimsIndex1765238400000',
      'AddStoredResponses1765584000000',
      'CreateEventVersions1765670400000',
    ],
    created: '"processed_events"',
  },
  {
    label: 'billing.webhook_claims (schema and table options)',
    options: { schema: 'billing', table: 'webhook_claims' },
    regclass: 'billing.webhook_claims',
    schema: 'billing',
    table: 'webhook_claims',
    migrationNames: [
      'CreateProcessedEventsBillingWebhookClaims1764547200000',
      'AddUnfinishedClaimsIndexBillingWebhookClaims1764892800000',
      'AddFailedClaimsIndexBillingWebhookClaims1765238400000',
      'AddStoredResponsesBillingWebhookClaims1765584000000',
      'CreateEventVersionsBillingWebhookClaims1765670400000',
    ],
    created: '"billing"."webhook_claims"',
  },
];

/** The table as the catalog describes it: columns, constraints and indexes with their definitions. */
interface TableShape {
  columns: { name: string; type: string; notNull: boolean; default: string | null }[];
  constraints: { name: string; definition: string }[];
  indexes: { name: string; definition: string }[];
}

/** Reads the table's shape from pg_catalog, independent of TypeORM's own introspection. */
async function tableShape(url: string, tableCase: TableCase): Promise<TableShape> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const columns = await client.query(
      `SELECT attname AS name, format_type(atttypid, atttypmod) AS type, attnotnull AS "notNull",
              pg_get_expr(adbin, adrelid) AS default
       FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum
       WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
       ORDER BY attname`,
      [tableCase.regclass],
    );
    const constraints = await client.query(
      `SELECT conname AS name, pg_get_constraintdef(oid) AS definition
       FROM pg_constraint
       -- PostgreSQL 18 also lists NOT NULL as constraints ('n'); the columns already say that.
       WHERE conrelid = $1::regclass AND contype <> 'n' ORDER BY conname`,
      [tableCase.regclass],
    );
    const indexes = await client.query(
      `SELECT indexname AS name, indexdef AS definition
       FROM pg_indexes WHERE schemaname = $1 AND tablename = $2 ORDER BY indexname`,
      [tableCase.schema, tableCase.table],
    );
    return { columns: columns.rows, constraints: constraints.rows, indexes: indexes.rows };
  } finally {
    await client.end();
  }
}

/** The versions table (ordering guard) beside a claims table: `<table>_versions`. */
function versionsCase(tableCase: TableCase): TableCase {
  const table = `${tableCase.table}_versions`;
  return { ...tableCase, table, regclass: `${tableCase.schema}.${table}` };
}

/** Names the migrations give, which the entity must reproduce for `synchronize` and `migration:generate`. */
function migrationNames(table: string) {
  return {
    constraints: [`${table}_pkey`, `${table}_status_check`],
    indexes: [
      `${table}_expiring_idx`,
      `${table}_failed_idx`,
      `${table}_pkey`,
      `${table}_retention_idx`,
      `${table}_unfinished_idx`,
    ],
  };
}

/**
 * The entity and the migrations describe one table: on a migrated database TypeORM finds nothing
 * to change, and `synchronize` on an empty one builds the migrations' table, names included; for
 * the default table and for one moved by the schema and table options.
 */
describe.each(CASES)('claims entity and migrations: $label', (tableCase) => {
  const adminUrl = process.env.TEST_POSTGRES_ADMIN_URL!;
  const names = migrationNames(tableCase.table);
  const databases = { migrated: '', empty: '' };
  const urls = { migrated: '', empty: '' };

  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: adminUrl });
    await client.connect();
    try {
      await client.query(sql);
    } finally {
      await client.end();
    }
  };
  /** A DataSource with only the library's entities for this table, as an app registers them. */
  const entityDataSource = (url: string, synchronize = false) =>
    new DataSource({ type: 'postgres', url, entities: idempotencyEntities(tableCase.options), synchronize });
  /** What `synchronize` / `migration:generate` would run on the database at `url`. */
  const pendingSchemaChanges = async (url: string): Promise<string[]> => {
    const dataSource = entityDataSource(url);
    await dataSource.initialize();
    try {
      return (await dataSource.driver.createSchemaBuilder().log()).upQueries.map((query) => query.query);
    } finally {
      await dataSource.destroy();
    }
  };
  const runMigrations = async (url: string): Promise<string[]> => {
    const dataSource = new DataSource({
      type: 'postgres',
      url,
      migrations: processedEventsMigrations(tableCase.options),
    });
    await dataSource.initialize();
    try {
      return (await dataSource.runMigrations()).map((migration) => migration.name);
    } finally {
      await dataSource.destroy();
    }
  };

  beforeAll(async () => {
    for (const which of ['migrated', 'empty'] as const) {
      databases[which] = `idem_schema_${randomBytes(6).toString('hex')}`;
      await admin(`CREATE DATABASE ${databases[which]}`);
      const url = new URL(adminUrl);
      url.pathname = `/${databases[which]}`;
      urls[which] = url.toString();
    }
    expect(await runMigrations(urls.migrated)).toEqual(tableCase.migrationNames);
  });

  afterAll(async () => {
    for (const name of Object.values(databases))
      if (name) await admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  });

  it('finds nothing to change on a migrated database (what synchronize and migration:generate compute)', async () => {
    expect(await pendingSchemaChanges(urls.migrated)).toEqual([]);
  });

  it('does notice a difference (the control: the check above is not vacuous)', async () => {
    const client = new pg.Client({ connectionString: urls.migrated });
    await client.connect();
    const index = `"${tableCase.schema}"."${tableCase.table}_retention_idx"`;
    try {
      await client.query(`ALTER INDEX ${index} RENAME TO renamed_retention_idx`);
      const changes = await pendingSchemaChanges(urls.migrated);
      expect(changes.some((query) => query.includes('"renamed_retention_idx"'))).toBe(true);
      expect(changes.some((query) => query.includes(`CREATE INDEX "${tableCase.table}_retention_idx"`))).toBe(
        true,
      );
    } finally {
      await client.query(
        `ALTER INDEX "${tableCase.schema}".renamed_retention_idx RENAME TO "${tableCase.table}_retention_idx"`,
      );
      await client.end();
    }
    expect(await pendingSchemaChanges(urls.migrated)).toEqual([]);
  });

  it('has the migrations create the names the entity declares', async () => {
    const shape = await tableShape(urls.migrated, tableCase);
    expect(shape.constraints.map((constraint) => constraint.name)).toEqual(names.constraints);
    expect(shape.indexes.map((index) => index.name)).toEqual(names.indexes);
  });

  it('synchronize on an empty database creates the same table, constraint and index names included', async () => {
    const client = new pg.Client({ connectionString: urls.empty });
    await client.connect();
    // synchronize creates tables, not schemas: an app that moves the table creates its schema.
    await client.query(`CREATE SCHEMA IF NOT EXISTS "${tableCase.schema}"`);
    await client.end();
    expect(await pendingSchemaChanges(urls.empty)).toEqual(
      expect.arrayContaining([expect.stringContaining(`CREATE TABLE ${tableCase.created}`)]),
    );
    const dataSource = entityDataSource(urls.empty, true);
    await dataSource.initialize();
    await dataSource.destroy();

    const synchronized = await tableShape(urls.empty, tableCase);
    expect(synchronized.constraints.map((constraint) => constraint.name)).toEqual(names.constraints);
    expect(synchronized.indexes.map((index) => index.name)).toEqual(names.indexes);
    // Not only the names: every column, constraint and index definition is the migrations'.
    expect(synchronized).toEqual(await tableShape(urls.migrated, tableCase));
    // The ordering guard's versions table beside it, the same way.
    const versions = versionsCase(tableCase);
    const synchronizedVersions = await tableShape(urls.empty, versions);
    expect(synchronizedVersions.indexes.map((index) => index.name)).toEqual([
      `${versions.table}_idx`,
      `${versions.table}_pkey`,
    ]);
    expect(synchronizedVersions).toEqual(await tableShape(urls.migrated, versions));
    // And TypeORM, asked again, is content with what it built.
    expect(await pendingSchemaChanges(urls.empty)).toEqual([]);
  });

  it('lets the migrations run afterwards on the synchronized table without adding anything', async () => {
    const before = await tableShape(urls.empty, tableCase);
    expect(await runMigrations(urls.empty)).toEqual(tableCase.migrationNames);
    expect(await tableShape(urls.empty, tableCase)).toEqual(before);
  });
});
