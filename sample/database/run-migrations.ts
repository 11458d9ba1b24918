import { Logger } from '@nestjs/common';
import { MigrationExecutor, type DataSource } from 'typeorm';

/** Any constant works; it only has to be the same in every replica of the app. */
export const MIGRATION_LOCK_ID = 724_600_101;

/**
 * Applies pending migrations, one replica at a time. TypeORM takes no lock of its own, and two
 * replicas starting together would both try to create the same tables. The lock is a
 * transaction-level advisory lock, taken in the transaction the migrations run in: the second
 * replica waits on it, then finds nothing to do. A session lock (`pg_advisory_lock`) would not
 * hold behind a pooler in transaction mode (PgBouncer, RDS Proxy, Supavisor): each statement
 * outside a transaction may run on another server connection, so the lock stays with whichever
 * server session took it, the unlock goes to another, and the next start waits forever. A
 * transaction keeps one server connection until it ends, and its lock ends with it, committed,
 * rolled back or cut off.
 */
export async function runMigrationsOnce(dataSource: DataSource): Promise<DataSource> {
  const logger = new Logger('Migrations');
  const runner = dataSource.createQueryRunner();
  try {
    await runner.startTransaction();
    await runner.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK_ID]);
    // On this runner, inside its transaction: TypeORM neither begins nor commits one of its own.
    const executor = new MigrationExecutor(dataSource, runner);
    executor.transaction = 'all';
    const applied = await executor.executePendingMigrations();
    await runner.commitTransaction();
    logger.log(
      applied.length > 0
        ? `Applied ${applied.map((migration) => migration.name).join(', ')}`
        : 'Schema up to date',
    );
  } catch (error) {
    // Nothing half-applied stays: the migrations, their records and the lock roll back together.
    if (runner.isTransactionActive) await runner.rollbackTransaction().catch(() => undefined);
    throw error;
  } finally {
    await runner.release();
  }
  return dataSource;
}
