/**
 * Every reach into TypeORM's private state, in one place. TypeORM has no API to send a named
 * (prepared) statement, to reach the pg pool under a DataSource, or to adopt a transaction begun
 * on a QueryRunner's connection, and the claim path needs all three to cost no more round trips
 * than hand-written SQL; nor does it say how deep a runner's transaction is, which following the
 * handler's own savepoints needs (transactionDepth). `assertTypeOrmInternals` checks them when the module starts, so a TypeORM
 * release that moves them fails the boot with a message naming what moved, not a delivery.
 */
import type { Pool, PoolClient } from 'pg';
import type { DataSource, QueryRunner } from 'typeorm';

const unsupportedDriver = (type: string) =>
  `IdempotencyModule needs a DataSource on the postgres driver (node-postgres), got type '${type}'`;

const typeormInternalsMoved = (missing: string[]) =>
  `IdempotencyModule cannot run on this TypeORM: ${missing.join(', ')} moved or changed (see lib/postgres/typeorm-internals.ts). Use a supported TypeORM (0.3.x or 1.x) and report the version`;

/** What TypeORM's startTransaction() and commitTransaction() set on a PostgresQueryRunner. */
interface TransactionState {
  isTransactionActive: boolean;
  transactionDepth: number;
}

/**
 * The pg pool under a TypeORM postgres DataSource (its master pool under replication): the claim
 * path talks to pg directly, because TypeORM's query() cannot send a named statement.
 */
export function pgPoolOf(dataSource: DataSource): Pool {
  const pool = (dataSource.driver as { master?: Partial<Pool> }).master;
  if (typeof pool?.query !== 'function') throw new Error(unsupportedDriver(String(dataSource.options.type)));
  return pool as Pool;
}

/** Pools already guarded by listenForEarlyErrors (several modules may share one DataSource). */
const guardedPools = new WeakSet<Pool>();

/**
 * Gives every new pg client of the DataSource's pool an 'error' listener of its own, for as long
 * as it lives. pg-pool takes its idle listener off a client as it hands it out, and TypeORM's
 * QueryRunner puts its own on only in a promise callback. A new client is handed out while pg
 * parses the server's ReadyForQuery, so when the session's FATAL arrives in the same read (a
 * backend terminated, or a server shutting down, as the session starts) pg emits 'error' with
 * no listener, and Node ends the process. With this listener the error is kept as pg keeps any
 * other: the client is marked unusable and its next query fails, as a lost connection.
 */
export function listenForEarlyErrors(dataSource: DataSource): void {
  const pool = pgPoolOf(dataSource);
  if (guardedPools.has(pool)) return;
  guardedPools.add(pool);
  pool.on('connect', (client) => {
    guardedClients.add(client);
    client.on('error', ignoreError);
  });
}

/** The early-error listener: pg has already recorded the error on the client. */
function ignoreError(): void {}

/** Clients that have the early-error listener, whether from the pool's 'connect' or from listenForErrors. */
const guardedClients = new WeakSet<PoolClient>();

/**
 * Gives a client taken from the pool the early-error listener if it has none yet: a client the
 * pool made before listenForEarlyErrors() (TypeORM's own first connections, at initialize) has
 * no listener of its own while it is checked out, and a delivery that makes no QueryRunner
 * (whose connect() would add one) must not let a terminated backend end the process. Once per
 * client: the WeakSet's check is all a delivery pays.
 */
export function listenForErrors(client: PoolClient): void {
  if (guardedClients.has(client)) return;
  guardedClients.add(client);
  client.on('error', ignoreError);
}

/** What PostgresQueryRunner.connect() sets once it has its pg client, and what release() reads. */
interface ConnectionState {
  databaseConnection?: PoolClient;
  releaseCallback?: (error?: Error) => void;
  /** TypeORM 1.x and late 0.3.x: release() that hands pg-pool the error, so it drops the client. */
  releasePostgresConnection?(error?: Error): Promise<void>;
  driver: { connectedQueryRunners: QueryRunner[] };
}

/**
 * Hands `runner` the pg client `client` (taken from the DataSource's pool by the caller), as
 * PostgresQueryRunner.connect() does once its pool answers: the runner is then connected, its
 * queries go to that client, a client error releases it, and release() gives the client back.
 * TypeORM's connect() gets there through obtainMasterConnection(), a `new Promise` over the pool's
 * callback and a `.then`: five promises per delivery with the caller's awaits, where the pool's
 * own `connect()` is one. The release callback never throws (a client released twice is already
 * back in the pool), so `runner.release()` never rejects and need not be awaited.
 */
export function attachConnection(runner: QueryRunner, client: PoolClient): void {
  const state = runner as unknown as ConnectionState;
  // As TypeORM's own connect() does: a client error releases the runner (its next query fails).
  const onError = (error: Error) =>
    void (state.releasePostgresConnection ? state.releasePostgresConnection(error) : runner.release());
  state.driver.connectedQueryRunners.push(runner);
  state.databaseConnection = client;
  state.releaseCallback = (error?: Error) => {
    client.removeListener('error', onError);
    try {
      client.release(error);
    } catch {
      // Released already: pg-pool refuses a second release, and the client is not ours to use.
    }
  };
  client.on('error', onError);
}

/**
 * Releases a runner connected by attachConnection(), as its release() does, without the promise
 * of an async function per delivery: marked released (its manager refuses queries from then on),
 * its client back in the pool, off the driver's list of connected runners. A runner released
 * already (a client error released it) is left as it is.
 */
export function releaseRunner(runner: QueryRunner): void {
  const state = runner as unknown as ConnectionState & { isReleased: boolean };
  if (state.isReleased) return;
  state.isReleased = true;
  const release = state.releaseCallback;
  state.releaseCallback = undefined;
  release?.();
  const connected = state.driver.connectedQueryRunners;
  const index = connected.indexOf(runner);
  if (index !== -1) connected.splice(index, 1);
}

/**
 * Tells the runner a transaction is open on its connection, as startTransaction() would, without
 * sending BEGIN: the caller sends BEGIN together with the claim. Set before BEGIN is sent, so that
 * a failure is rolled back.
 */
export function adoptTransaction(runner: QueryRunner): void {
  const state = runner as unknown as TransactionState;
  state.isTransactionActive = true;
  state.transactionDepth = 1;
}

/** Tells the runner its transaction is over (a COMMIT or ROLLBACK sent straight on the connection). */
export function forgetTransaction(runner: QueryRunner): void {
  const state = runner as unknown as TransactionState;
  state.isTransactionActive = false;
  state.transactionDepth = 0;
}

/**
 * How many transaction levels the runner has open: 1 for the claim's own transaction (see
 * adoptTransaction), one more for each level its startTransaction() opened inside (TypeORM's
 * `SAVEPOINT typeorm_<depth>`: the handler's `manager.transaction()`, nestjs-cls's
 * Propagation.Nested), 0 once it is over. TypeORM keeps it protected; its transaction events do not
 * carry it. Read when such an event names the claim's runner (ClaimTransaction.followHandlerLevel):
 * startTransaction() broadcasts before it counts the new level, commitTransaction() and
 * rollbackTransaction() after they uncounted theirs.
 */
export function transactionDepth(runner: QueryRunner): number {
  return (runner as unknown as TransactionState).transactionDepth;
}

/**
 * Fails fast when this TypeORM no longer has what the functions above rely on: a postgres driver
 * with a pg pool, and QueryRunners that keep their transaction state in `isTransactionActive` and
 * `transactionDepth`. Creating a QueryRunner takes no connection.
 */
export function assertTypeOrmInternals(dataSource: DataSource): void {
  const pool = pgPoolOf(dataSource);
  const missing: string[] = [];
  if (typeof pool.connect !== 'function') missing.push('driver.master.connect()');
  const runner = dataSource.createQueryRunner() as unknown as Partial<TransactionState> & QueryRunner;
  try {
    if (typeof runner.isTransactionActive !== 'boolean') missing.push('QueryRunner.isTransactionActive');
    if (typeof runner.transactionDepth !== 'number') missing.push('QueryRunner.transactionDepth');
    if (typeof runner.broadcaster?.broadcast !== 'function') missing.push('QueryRunner.broadcaster');
    if (typeof runner.connect !== 'function') missing.push('QueryRunner.connect()');
    const connection = runner as unknown as Partial<ConnectionState>;
    if (!Array.isArray(connection.driver?.connectedQueryRunners)) {
      missing.push('PostgresDriver.connectedQueryRunners');
    }
  } finally {
    void runner.release();
  }
  if (missing.length > 0) throw new Error(typeormInternalsMoved(missing));
}
