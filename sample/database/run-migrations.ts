import { Logger } from '@nestjs/common';
import type { DataSource } from 'typeorm';

/** Any constant works; it only has to be the same in every replica of the app. */
const MIGRATION_LOCK_ID = 724_600_101;

/**
 * Applies pending migrations, one replica at a time. TypeORM takes no lock of its own, and two
 * replicas starting together would both try to create the same tables; a session advisory lock
 * on a connection held for the whole run makes the second one wait and then find nothing to do.
 */
export async function runMigrationsOnce(dataSource: DataSource): Promise<DataSource> {
  const logger = new Logger('Migrations');
  const runner = dataSource.createQueryRunner();
  await runner.connect();
  try {
    await runner.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_ID]);
    const applied = await dataSource.runMigrations();
    logger.log(
      applied.length > 0
        ? `Applied ${applied.map((migration) => migration.name).join(', ')}`
        : 'Schema up to date',
    );
  } finally {
    // Releasing the connection would keep a pooled session's lock; unlock explicitly.
    await runner.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_ID]).catch(() => undefined);
    await runner.release();
  }
  return dataSource;
}
