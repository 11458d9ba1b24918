/**
 * Every reach into TypeORM's private state, in one place. TypeORM has no API to send a named
 * (prepared) statement, to reach the pg pool under a DataSource, or to adopt a transaction begun
 * on a QueryRunner's connection, and the claim path needs all three to cost no more round trips
 * than hand-written SQL. `assertTypeOrmInternals` checks them when the module starts, so a TypeORM
 * release that moves them fails the boot with a message naming what moved, not a delivery.
 */
import type { Pool, PoolClient } from 'pg';
import type { DataSource, QueryRunner } from 'typeorm';
import { typeormInternalsMoved, unsupportedDriver } from '../idempotency.messages.js';

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

/** Connects the runner and returns its own pg client (PostgresQueryRunner.connect() resolves to it). */
export async function connectRunner(runner: QueryRunner): Promise<PoolClient> {
  return (await runner.connect()) as PoolClient;
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
  } finally {
    void runner.release();
  }
  if (missing.length > 0) throw new Error(typeormInternalsMoved(missing));
}
