import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { EmbeddedCluster } from '../../sample/database/embedded-cluster.js';
import { createMigratedDatabase } from '../../test/support/migrated-database.js';
import { freePort } from '../../test/support/postgres-server.js';
import { BENCH_SCHEMA } from '../server/hand-written.sql.js';

/** The PostgreSQL server a bench run uses. */
export interface BenchPostgres {
  adminUrl: string;
  /** Whether pg_stat_statements can be read (the database's own statement count). */
  statementStats: boolean;
  description: string;
  stop(): Promise<void>;
}

/**
 * `DATABASE_URL` if set, else a throwaway embedded PostgreSQL. Like the tests'
 * startPostgres() (same package, same flags) but with pg_stat_statements preloaded, so the
 * database's own count of statements can confirm the one the bench server counts.
 */
export async function startBenchPostgres(): Promise<BenchPostgres> {
  if (process.env.DATABASE_URL) {
    const adminUrl = process.env.DATABASE_URL;
    return {
      adminUrl,
      statementStats: await enableStatementStats(adminUrl),
      description: 'DATABASE_URL',
      stop: async () => undefined,
    };
  }
  const parent = await mkdtemp(join(tmpdir(), 'idempotency-bench-pg-'));
  await chmod(parent, 0o755); // as root, Postgres runs as the `postgres` user and must reach it
  const port = await freePort();
  const server = new EmbeddedCluster({
    dataDir: join(parent, 'data'),
    port,
    user: 'postgres',
    password: 'postgres',
    postgresFlags: [
      '-c',
      'max_connections=200',
      '-c',
      'fsync=off',
      '-c',
      'listen_addresses=127.0.0.1',
      '-c',
      'shared_preload_libraries=pg_stat_statements',
    ],
  });
  await server.initialise();
  await server.start();
  const adminUrl = `postgres://postgres:postgres@127.0.0.1:${port}/postgres`;
  const version = await scalar(adminUrl, 'SHOW server_version');
  return {
    adminUrl,
    statementStats: await enableStatementStats(adminUrl),
    description: `embedded PostgreSQL ${version} (fsync=off)`,
    stop: async () => {
      await server.stop();
      await rm(parent, { recursive: true, force: true });
    },
  };
}

/** A fresh database with the library's migration and the bench's `orders` table. */
export function createBenchDatabase(adminUrl: string): Promise<{ url: string; name: string }> {
  return createMigratedDatabase(adminUrl, 'bench', BENCH_SCHEMA);
}

async function enableStatementStats(adminUrl: string): Promise<boolean> {
  try {
    await scalar(adminUrl, 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements');
    await scalar(adminUrl, 'SELECT count(*) FROM pg_stat_statements');
    return true;
  } catch {
    return false; // not preloaded on this server: the client-side count stands alone
  }
}

async function scalar(url: string, sql: string): Promise<unknown> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query(sql);
    return rows[0] ? Object.values(rows[0])[0] : undefined;
  } finally {
    await client.end();
  }
}
