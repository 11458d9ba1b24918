import { Inject, Injectable, Logger } from '@nestjs/common';
import type { PoolClient } from 'pg';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import { IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';
import { claimFailedLog, slowTransaction } from '../idempotency.messages.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig, IdempotentWebhookMetadata } from '../interfaces/index.js';
import {
  ClaimUnavailableError,
  errorCode,
  LOCK_NOT_AVAILABLE,
  RETRYABLE_CODES,
  type ClaimResult,
} from './claim-result.js';
import { claimQuery } from './claim-statement.js';
import { TRANSACTION_CLAIM } from './claim.sql.js';

/** How often a serialization failure or deadlock on the claim is retried from scratch. */
const MAX_TRANSACTION_TRIES = 3;
/** The slow-transaction warning repeats at most this often per handler. */
const SLOW_WARNING_EVERY_MS = 60_000;

/**
 * Transaction mode (seed "fix one"): the claim and everything the handler writes through the
 * transaction's EntityManager commit together. A crash or a throw rolls both back and the next
 * delivery claims cleanly. A concurrent duplicate blocks on the first claim's row lock for at most
 * `concurrentDuplicateWaitMs`: it then sees the commit (replayed), the rollback (claims and runs),
 * or neither (in flight, 409).
 */
@Injectable()
export class TransactionClaim {
  private readonly logger = new Logger('IdempotencyModule');
  private readonly lastSlowWarning = new Map<string, number>();
  /** Deliveries of this process that are claiming or running, by (scope, key); settle when done. */
  private readonly inFlight = new Map<string, Promise<unknown>>();
  /** lock_timeout of the claim; 0 would mean "wait forever", so 1 ms is the shortest real bound. */
  private readonly lockTimeout: string;

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
  ) {
    this.lockTimeout = `${Math.max(1, Math.ceil(config.concurrentDuplicateWaitMs))}ms`;
  }

  async run<T>(
    meta: IdempotentWebhookMetadata,
    key: string,
    handler: (manager: EntityManager) => Promise<T>,
  ): Promise<ClaimResult<T>> {
    const id = `${meta.scope}\u0000${key}`;
    const first = this.inFlight.get(id);
    // A duplicate of a delivery this process is already running waits for it here, holding no
    // pool connection: a storm of duplicates then cannot starve unrelated events. Duplicates
    // arriving at other replicas still wait in Postgres, bounded by lock_timeout.
    if (first && !(await settlesWithin(first, this.config.concurrentDuplicateWaitMs))) {
      this.metrics.count('in_flight', meta.scope, key);
      return { kind: 'in_flight', retryAfterSeconds: this.config.retryAfterSeconds };
    }
    const run = this.claimAndRun(meta, key, handler);
    if (!this.inFlight.has(id)) {
      this.inFlight.set(id, run);
      const forget = () => this.inFlight.delete(id);
      run.then(forget, forget);
    }
    return run;
  }

  private async claimAndRun<T>(
    meta: IdempotentWebhookMetadata,
    key: string,
    handler: (manager: EntityManager) => Promise<T>,
  ): Promise<ClaimResult<T>> {
    // A retry re-runs claim and handler in a fresh transaction: replaying recorded SQL is not enough.
    for (let attempt = 1; ; attempt++) {
      const runner = this.dataSource.createQueryRunner();
      try {
        const claimed = await this.claim(runner, meta, key);
        if (claimed === 'in_flight') {
          this.metrics.count('in_flight', meta.scope, key);
          return { kind: 'in_flight', retryAfterSeconds: this.config.retryAfterSeconds };
        }
        if (!claimed) {
          await runner.rollbackTransaction();
          this.metrics.count('replayed', meta.scope, key);
          return { kind: 'replayed' };
        }
        const value = await this.work(runner, meta, key, handler);
        await this.commit(runner, meta, key);
        this.metrics.count('claimed', meta.scope, key);
        return { kind: 'processed', value };
      } catch (error) {
        if (attempt < MAX_TRANSACTION_TRIES && RETRYABLE_CODES.has(errorCode(error) ?? '')) continue;
        throw error;
      } finally {
        await runner.release();
      }
    }
  }

  /** true: ours; false: already done; 'in_flight': another delivery holds it past the bound. */
  private async claim(
    runner: QueryRunner,
    meta: IdempotentWebhookMetadata,
    key: string,
  ): Promise<boolean | 'in_flight'> {
    try {
      await runner.startTransaction();
      // Straight to the runner's pg client: TypeORM's query() cannot send a prepared statement.
      const client = (await runner.connect()) as PoolClient;
      const values = [meta.scope, key, meta.source, this.lockTimeout];
      const result = await client.query(
        claimQuery(TRANSACTION_CLAIM, values, this.config.preparedStatements),
      );
      return result.rowCount === 1;
    } catch (error) {
      await this.rollbackQuietly(runner);
      const code = errorCode(error);
      if (code === LOCK_NOT_AVAILABLE) return 'in_flight';
      if (RETRYABLE_CODES.has(code ?? '')) throw error;
      this.logger.error(claimFailedLog(meta.scope, key, code, error));
      throw new ClaimUnavailableError(key, code, error);
    }
  }

  private async work<T>(
    runner: QueryRunner,
    meta: IdempotentWebhookMetadata,
    key: string,
    handler: (manager: EntityManager) => Promise<T>,
  ): Promise<T> {
    const started = performance.now();
    try {
      return await handler(runner.manager);
    } catch (error) {
      await this.rollbackQuietly(runner);
      this.metrics.count('failed', meta.scope, key);
      throw error;
    } finally {
      this.warnIfSlow(meta.scope, performance.now() - started);
    }
  }

  private async commit(runner: QueryRunner, meta: IdempotentWebhookMetadata, key: string): Promise<void> {
    try {
      await runner.commitTransaction();
    } catch (error) {
      // Nothing is known to be committed: the sender must retry, and the retry is safe either way.
      await this.rollbackQuietly(runner);
      const code = errorCode(error);
      if (RETRYABLE_CODES.has(code ?? '')) throw error;
      this.logger.error(claimFailedLog(meta.scope, key, code, error));
      throw new ClaimUnavailableError(key, code, error);
    }
  }

  private async rollbackQuietly(runner: QueryRunner): Promise<void> {
    if (!runner.isTransactionActive) return;
    try {
      await runner.rollbackTransaction();
    } catch {
      // The connection is gone; Postgres rolls the transaction back on its own.
    }
  }

  private warnIfSlow(scope: string, elapsedMs: number): void {
    if (elapsedMs <= this.config.slowTransactionWarnMs) return;
    const now = Date.now();
    if (now - (this.lastSlowWarning.get(scope) ?? -Infinity) < SLOW_WARNING_EVERY_MS) return;
    this.lastSlowWarning.set(scope, now);
    this.logger.warn(slowTransaction(scope, Math.round(elapsedMs), this.config.slowTransactionWarnMs));
  }
}

/** Resolves true once `promise` settles (either way), false if `ms` passes first. */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  const settled = promise.then(
    () => true as const,
    () => true as const,
  );
  try {
    return await Promise.race([settled, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
