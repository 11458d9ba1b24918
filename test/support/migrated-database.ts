import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { IDEMPOTENCY_MIGRATIONS } from '../../lib/index.js';

/**
 * Creates a database named `<prefix>_<random>` on the server at `adminUrl`, runs the library's
 * migrations in it (as a user's app would), then `schema` if given. Done once per database, before
 * any app starts: creating the schema from several workers at once races.
 */
export async function createMigratedDatabase(
  adminUrl: string,
  prefix: string,
  schema?: string,
): Promise<{ url: string; name: string }> {
  const name = `${prefix}_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }

  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  const dataSource = new DataSource({
    type: 'postgres',
    url: url.toString(),
    migrations: IDEMPOTENCY_MIGRATIONS,
  });
  await dataSource.initialize();
  try {
    await dataSource.runMigrations();
    if (schema) await dataSource.query(schema);
  } finally {
    await dataSource.destroy();
  }
  return { url: url.toString(), name };
}
