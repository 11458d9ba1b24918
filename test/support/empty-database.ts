import { randomBytes } from 'node:crypto';
import pg from 'pg';

/** A database with nothing in it, for an app that runs its own migrations. */
export interface EmptyDatabase {
  url: string;
  /** A plain pg pool on the database, for assertions. */
  pool: pg.Pool;
  drop(): Promise<void>;
}

function adminUrl(): string {
  const url = process.env.TEST_POSTGRES_ADMIN_URL;
  if (!url) throw new Error('TEST_POSTGRES_ADMIN_URL is not set: run the tests through jest');
  return url;
}

async function admin(sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: adminUrl() });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

/**
 * Creates `<prefix>_<random>` on the run's server, empty: unlike createTestDatabase, no
 * migration runs here, so the app under test creates the library's table itself.
 */
export async function createEmptyDatabase(prefix: string): Promise<EmptyDatabase> {
  const name = `${prefix}_${randomBytes(6).toString('hex')}`;
  await admin(`CREATE DATABASE ${name}`);
  const url = new URL(adminUrl());
  url.pathname = `/${name}`;
  const pool = new pg.Pool({ connectionString: url.toString(), max: 2 });
  return {
    url: url.toString(),
    pool,
    async drop() {
      // pool.end() resolves once it has asked its clients to end, not once their sockets closed:
      // the FORCE below may end a backend first, and that client's error is of a pool being dropped.
      pool.on('error', () => undefined);
      await pool.end();
      await admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    },
  };
}
