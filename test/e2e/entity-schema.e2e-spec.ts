import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { CreateProcessedEvents1764547200000, IDEMPOTENCY_ENTITIES } from '../../lib/index.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/** Names the migration gives, which the entity must reproduce for `synchronize` and `migration:generate`. */
const MIGRATION_NAMES = {
  constraints: ['processed_events_pkey', 'processed_events_status_check'],
  indexes: ['processed_events_expiring_idx', 'processed_events_pkey', 'processed_events_retention_idx'],
};

/** processed_events as the catalog describes it: columns, constraints and indexes with their definitions. */
interface TableShape {
  columns: { name: string; type: string; notNull: boolean; default: string | null }[];
  constraints: { name: string; definition: string }[];
  indexes: { name: string; definition: string }[];
}

/** Reads processed_events' shape from pg_catalog, independent of TypeORM's own introspection. */
async function tableShape(url: string): Promise<TableShape> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const columns = await client.query(
      `SELECT attname AS name, format_type(atttypid, atttypmod) AS type, attnotnull AS "notNull",
              pg_get_expr(adbin, adrelid) AS default
       FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum
       WHERE attrelid = 'processed_events'::regclass AND attnum > 0 AND NOT attisdropped
       ORDER BY attname`,
    );
    const constraints = await client.query(
      `SELECT conname AS name, pg_get_constraintdef(oid) AS definition
       FROM pg_constraint
       -- PostgreSQL 18 also lists NOT NULL as constraints ('n'); the columns already say that.
       WHERE conrelid = 'processed_events'::regclass AND contype <> 'n' ORDER BY conname`,
    );
    const indexes = await client.query(
      `SELECT indexname AS name, indexdef AS definition
       FROM pg_indexes WHERE tablename = 'processed_events' ORDER BY indexname`,
    );
    return { columns: columns.rows, constraints: constraints.rows, indexes: indexes.rows };
  } finally {
    await client.end();
  }
}

/** A DataSource with only the library's entities, as an app registers them. */
function entityDataSource(url: string, synchronize = false): DataSource {
  return new DataSource({ type: 'postgres', url, entities: [...IDEMPOTENCY_ENTITIES], synchronize });
}

/** What `synchronize` / `migration:generate` would run on the database at `url`. */
async function pendingSchemaChanges(url: string): Promise<string[]> {
  const dataSource = entityDataSource(url);
  await dataSource.initialize();
  try {
    const sql = await dataSource.driver.createSchemaBuilder().log();
    return sql.upQueries.map((query) => query.query);
  } finally {
    await dataSource.destroy();
  }
}

/**
 * The entity and the migration describe one table: on a migrated database TypeORM finds nothing
 * to change, and `synchronize` on an empty one builds the migration's table, names included.
 */
describe('ProcessedEvent entity and CreateProcessedEvents1764547200000', () => {
  let migrated: TestDatabase;
  const adminUrl = process.env.TEST_POSTGRES_ADMIN_URL!;
  const emptyName = `idem_sync_${randomBytes(6).toString('hex')}`;
  let emptyUrl: string;

  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: adminUrl });
    await client.connect();
    try {
      await client.query(sql);
    } finally {
      await client.end();
    }
  };

  beforeAll(async () => {
    migrated = await createTestDatabase(undefined, { fixtureSchema: false });
    await admin(`CREATE DATABASE ${emptyName}`);
    const url = new URL(adminUrl);
    url.pathname = `/${emptyName}`;
    emptyUrl = url.toString();
  });

  afterAll(async () => {
    await migrated?.drop();
    await admin(`DROP DATABASE IF EXISTS ${emptyName} WITH (FORCE)`);
  });

  it('finds nothing to change on a migrated database (what synchronize and migration:generate compute)', async () => {
    expect(await pendingSchemaChanges(migrated.url)).toEqual([]);
  });

  it('does notice a difference (the control: the check above is not vacuous)', async () => {
    await migrated.pool.query('ALTER INDEX processed_events_retention_idx RENAME TO renamed_retention_idx');
    try {
      const changes = await pendingSchemaChanges(migrated.url);
      expect(changes.some((query) => query.includes('"renamed_retention_idx"'))).toBe(true);
      expect(changes.some((query) => query.includes('CREATE INDEX "processed_events_retention_idx"'))).toBe(
        true,
      );
    } finally {
      await migrated.pool.query('ALTER INDEX renamed_retention_idx RENAME TO processed_events_retention_idx');
    }
    expect(await pendingSchemaChanges(migrated.url)).toEqual([]);
  });

  it('has the migration create the names the entity declares', async () => {
    const shape = await tableShape(migrated.url);
    expect(shape.constraints.map((constraint) => constraint.name)).toEqual(MIGRATION_NAMES.constraints);
    expect(shape.indexes.map((index) => index.name)).toEqual(MIGRATION_NAMES.indexes);
  });

  it('synchronize on an empty database creates the same table, constraint and index names included', async () => {
    expect(await pendingSchemaChanges(emptyUrl)).toEqual(
      expect.arrayContaining([expect.stringContaining('CREATE TABLE "processed_events"')]),
    );
    const dataSource = entityDataSource(emptyUrl, true);
    await dataSource.initialize();
    await dataSource.destroy();

    const synchronized = await tableShape(emptyUrl);
    expect(synchronized.constraints.map((constraint) => constraint.name)).toEqual(
      MIGRATION_NAMES.constraints,
    );
    expect(synchronized.indexes.map((index) => index.name)).toEqual(MIGRATION_NAMES.indexes);
    // Not only the names: every column, constraint and index definition is the migration's.
    expect(synchronized).toEqual(await tableShape(migrated.url));
    // And TypeORM, asked again, is content with what it built.
    expect(await pendingSchemaChanges(emptyUrl)).toEqual([]);
  });

  it('lets the migration run afterwards on the synchronized table without adding anything', async () => {
    const before = await tableShape(emptyUrl);
    const dataSource = new DataSource({
      type: 'postgres',
      url: emptyUrl,
      migrations: [CreateProcessedEvents1764547200000],
    });
    await dataSource.initialize();
    try {
      expect((await dataSource.runMigrations()).map((migration) => migration.name)).toEqual([
        'CreateProcessedEvents1764547200000',
      ]);
    } finally {
      await dataSource.destroy();
    }
    expect(await tableShape(emptyUrl)).toEqual(before);
  });
});
