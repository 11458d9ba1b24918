import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { processedEventsMigrations } from '../../lib/index.js';

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
  const { url, name } = await createDatabase(adminUrl, prefix);
  const dataSource = new DataSource({
    type: 'postgres',
    url,
    migrations: processedEventsMigrations(),
  });
  await dataSource.initialize();
  try {
    await dataSource.runMigrations();
    if (schema) await dataSource.query(schema);
  } finally {
    await dataSource.destroy();
  }
  return { url, name };
}

/**
 * Creates a database named `<prefix>_<random>` on the server at `adminUrl`, as a copy of
 * `template` if given (which nobody may be connected to), else empty.
 */
export async function createDatabase(
  adminUrl: string,
  prefix: string,
  template?: string,
): Promise<{ url: string; name: string }> {
  const name = `${prefix}_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(template ? `CREATE DATABASE ${name} TEMPLATE ${template}` : `CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return { url: url.toString(), name };
}
