import pg from 'pg';
import { FIXTURE_SCHEMA } from '../fixtures/webhook-fixture.module.js';
import { createDatabase, createMigratedDatabase } from './migrated-database.js';
import { TEMPLATE_ENV } from './template-databases.js';

/** A database made for one test file, with the library's migration applied. */
export interface TestDatabase {
  url: string;
  name: string;
  /** A plain pg pool on the database, for assertions and for holding locks. */
  pool: pg.Pool;
  count(sql: string, parameters?: unknown[]): Promise<number>;
  drop(): Promise<void>;
}

function adminUrl(override?: string): string {
  const url = override ?? process.env.TEST_POSTGRES_ADMIN_URL;
  if (!url)
    throw new Error(
      'TEST_POSTGRES_ADMIN_URL is not set: run the tests through jest (test/support/global-setup.mjs)',
    );
  return url;
}

/** Options of createTestDatabase. */
export interface TestDatabaseOptions {
  /**
   * Create the fixture tables (`orders`, `downstream_calls`); false for apps that bring their own
   * schema (the sample's migration creates an `orders` table of its own).
   * @default true
   */
  fixtureSchema?: boolean;
}

/**
 * Creates a fresh database with the library's migration applied, before any app starts: creating
 * the schema from several workers at once races. On the run's server it is a copy of the template
 * global setup migrated (test/support/template-databases.ts). `serverAdminUrl` picks another server
 * than the run's shared one (e.g. a dedicated server an outage test stops).
 */
export async function createTestDatabase(
  serverAdminUrl?: string,
  options: TestDatabaseOptions = {},
): Promise<TestDatabase> {
  const withFixtures = options.fixtureSchema !== false;
  // On the run's own server, a copy of the template global setup migrated once; elsewhere (a
  // server of the test's own) the migrations run here.
  const template = serverAdminUrl
    ? undefined
    : process.env[withFixtures ? TEMPLATE_ENV.fixtures : TEMPLATE_ENV.bare];
  const { url, name } = template
    ? await createDatabase(adminUrl(), 'idem', template)
    : await createMigratedDatabase(
        adminUrl(serverAdminUrl),
        'idem',
        withFixtures ? FIXTURE_SCHEMA : undefined,
      );
  const pool = new pg.Pool({ connectionString: url, max: 60 });
  // An idle client whose server goes away (outage tests stop it) emits 'error' on the pool; with
  // no listener that would crash the Jest worker. The next query reports the failure instead.
  pool.on('error', () => undefined);
  return {
    url,
    name,
    pool,
    async count(sql, parameters = []) {
      const { rows } = await pool.query(sql, parameters);
      return Number(Object.values(rows[0] ?? { n: 0 })[0]);
    },
    async drop() {
      await pool.end();
      const client = new pg.Client({ connectionString: adminUrl(serverAdminUrl) });
      await client.connect();
      await client.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await client.end();
    },
  };
}

/** Sessions on the test database blocked on a lock: concurrent duplicates waiting on a held claim. */
export function lockWaiters(db: TestDatabase): Promise<number> {
  return db.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`, [
    db.name,
  ]);
}

/** Sessions on the test database inside a transaction, other than the asking one. */
export function openTransactions(db: TestDatabase): Promise<number> {
  return db.count(
    `SELECT count(*) FROM pg_stat_activity
     WHERE datname = $1 AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
       AND backend_type = 'client backend'`,
    [db.name],
  );
}
