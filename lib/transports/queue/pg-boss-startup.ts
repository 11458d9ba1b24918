import type { Logger } from '@nestjs/common';
import type { SqlExecutor } from '../../core/claim-strategy.js';
import { pgBossFailed } from '../../idempotency.messages.js';
import { isCatalogRace, isRetryable } from '../../postgres/pg-errors.js';
import type { HandoffConfig, QueueSettings } from './handoff-options.js';
import type { PgBoss, PgBossConstructor } from './pg-boss.js';
import { describeError } from '../../idempotency.messages.js';

const pgBossInstallRaced = (schema: string, error: unknown) =>
  `pg-boss: another instance was installing schema ${schema} at the same moment (${describeError(error)}); starting again`;

const queueCreationRaced = (queue: string, error: unknown) =>
  `pg-boss: another instance was creating queue ${queue} at the same moment (${describeError(error)}); creating it again`;

/** Tries of pg-boss's start, and of each queue's creation, when another replica does the same at that moment. */
const INSTALL_ATTEMPTS = 3;
/**
 * A pause of 50-250 ms before trying again after a race with another replica: replicas that
 * booted together would otherwise meet again at once.
 */
const raceBackoff = () => new Promise<void>((resolve) => setTimeout(resolve, 50 + Math.random() * 200));

/**
 * Starts pg-boss on `db` (the DataSource's pool), installing or migrating its schema, and creates
 * `queues` and their dead-letter queues with this boot's settings. Replicas booting together race
 * on both; the races are retried here (see startPgBoss and createQueues). A failed boot leaves
 * no pg-boss timer running.
 */
export async function startHandoffQueues(
  handoff: HandoffConfig,
  queues: ReadonlyMap<string, QueueSettings>,
  PgBoss: PgBossConstructor,
  db: SqlExecutor,
  logger: Logger,
): Promise<PgBoss> {
  const boss = await startPgBoss(handoff, PgBoss, db, logger);
  try {
    await createQueues(boss, queues, logger);
  } catch (error) {
    // A failed boot must not leave pg-boss's maintenance timer running.
    await boss.stop({ graceful: false, close: false, wait: true }).catch(() => undefined);
    throw error;
  }
  return boss;
}

/**
 * Starts pg-boss, installing or migrating its schema. Replicas booting at once on a fresh
 * database race on that install: pg-boss serializes it with an advisory lock, but the session
 * that waited can still fail on PostgreSQL's catalog (`CREATE SCHEMA IF NOT EXISTS` meets the
 * schema the other just committed as a unique violation), which pg-boss does not treat as the
 * race it is. The next attempt finds the schema installed. A failed start leaves the instance
 * marked as starting, so each attempt takes a new one.
 */
async function startPgBoss(
  handoff: HandoffConfig,
  PgBoss: PgBossConstructor,
  db: SqlExecutor,
  logger: Logger,
): Promise<PgBoss> {
  for (let attempt = 1; ; attempt++) {
    const boss = new PgBoss({
      db,
      schema: handoff.schema,
      migrate: true,
      supervise: true,
      // No cron: the handoff schedules nothing, and pg-boss's timekeeper would add a queue and a worker.
      schedule: false,
      maintenanceIntervalSeconds: handoff.maintenanceIntervalSeconds,
    });
    // An EventEmitter 'error' without a listener would throw from pg-boss's timers.
    boss.on('error', (error) => logger.error(pgBossFailed(error)));
    try {
      await boss.start();
      return boss;
    } catch (error) {
      if (attempt >= INSTALL_ATTEMPTS || !isCatalogRace(error)) throw error;
      logger.warn(pgBossInstallRaced(handoff.schema, error));
      // Nothing to stop: only the install can have failed, and pg-boss starts its timers after it.
      await raceBackoff();
    }
  }
}

/**
 * Dead-letter queues first (a queue's dead_letter references an existing queue), then the queues.
 * Replicas booting at once create the same queues at once, and pg-boss's create_queue() can
 * deadlock with itself: one inserts the queue row and then adds its partition's foreign keys
 * (a lock on the queue table), while the other's insert waits on that row holding a lock the
 * first needs. PostgreSQL rolls one back (40P01); run again, it finds the queue made.
 */
async function createQueues(
  boss: PgBoss,
  queues: ReadonlyMap<string, QueueSettings>,
  logger: Logger,
): Promise<void> {
  const deadLetters = new Set([...queues.values()].map((settings) => settings.deadLetter));
  for (const name of deadLetters) {
    if (!queues.has(name)) await againIfRaced(logger, name, () => boss.createQueue(name, {}));
  }
  for (const [name, settings] of queues) {
    const options = {
      retryLimit: settings.retryLimit,
      retryDelay: settings.retryDelaySeconds,
      retryBackoff: settings.retryBackoff,
      expireInSeconds: settings.expireInSeconds,
      deadLetter: settings.deadLetter,
    };
    await againIfRaced(logger, name, () => boss.createQueue(name, options));
    // createQueue leaves an existing queue as it was: this boot's settings apply from now on.
    await againIfRaced(logger, name, () => boss.updateQueue(name, options));
  }
}

/** `step`, run again (up to INSTALL_ATTEMPTS in all) when it lost a race with another replica. */
async function againIfRaced(logger: Logger, queue: string, step: () => Promise<void>): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await step();
    } catch (error) {
      if (attempt >= INSTALL_ATTEMPTS || !(isRetryable(error) || isCatalogRace(error))) throw error;
      logger.warn(queueCreationRaced(queue, error));
      await raceBackoff();
    }
  }
}
