import { Inject, Injectable, Logger } from '@nestjs/common';
import type { DataSource, EntityManager } from 'typeorm';
import { IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';
import { claimFailedLog, slowTransaction, transactionAbortedLog } from '../idempotency.messages.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig, IdempotentWebhookMetadata } from '../interfaces/index.js';
import {
  ClaimUnavailableError,
  errorCode,
  LOCK_NOT_AVAILABLE,
  RETRYABLE_CODES,
  TransactionAbortedError,
  type ClaimResult,
} from './claim-result.js';
import { ClaimTransaction, type ClaimTransactionOptions } from './claim-transaction.js';

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

  /** Claims `key`, runs `handler` in the claim's transaction and commits both, or neither. */
  run<T>(
    meta: IdempotentWebhookMetadata,
    key: string,
    handler: (manager: EntityManager) => Promise<T>,
  ): Promise<ClaimResult<T>> {
    const id = `${meta.scope}\u0000${key}`;
    const first = this.inFlight.get(id);
    if (first) return this.afterFirst(first, id, meta, key, handler);
    return this.track(id, this.claimAndRun(meta, key, handler));
  }

  /**
   * A duplicate of a delivery this process is already running waits for it here, holding no
   * pool connection: a storm of duplicates then cannot starve unrelated events. Duplicates
   * arriving at other replicas still wait in Postgres, bounded by lock_timeout.
   */
  private async afterFirst<T>(
    first: Promise<unknown>,
    id: string,
    meta: IdempotentWebhookMetadata,
    key: string,
    handler: (manager: EntityManager) => Promise<T>,
  ): Promise<ClaimResult<T>> {
    if (!(await settlesWithin(first, this.config.concurrentDuplicateWaitMs))) {
      this.metrics.count('in_flight', meta.scope, key);
      return { kind: 'in_flight', retryAfterSeconds: this.config.retryAfterSeconds };
    }
    return this.track(id, this.claimAndRun(meta, key, handler));
  }

  private track<T>(id: string, run: Promise<T>): Promise<T> {
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
      const transaction = new ClaimTransaction(
        this.dataSource.createQueryRunner(),
        this.transactionOptions(),
      );
      try {
        const claimed = await this.claim(transaction, meta, key);
        if (claimed === 'in_flight') {
          this.metrics.count('in_flight', meta.scope, key);
          return { kind: 'in_flight', retryAfterSeconds: this.config.retryAfterSeconds };
        }
        if (!claimed) {
          await transaction.end('ROLLBACK');
          this.metrics.count('replayed', meta.scope, key);
          return { kind: 'replayed' };
        }
        const value = await this.work(transaction, meta, key, handler);
        await this.commit(transaction, meta, key);
        this.metrics.count('claimed', meta.scope, key);
        return { kind: 'processed', value };
      } catch (error) {
        if (attempt < MAX_TRANSACTION_TRIES && RETRYABLE_CODES.has(errorCode(error) ?? '')) continue;
        throw error;
      } finally {
        await transaction.release();
      }
    }
  }

  /** true: ours; false: already done; 'in_flight': another delivery holds it past the bound. */
  private claim(
    transaction: ClaimTransaction,
    meta: IdempotentWebhookMetadata,
    key: string,
  ): Promise<boolean | 'in_flight'> {
    // Chained rather than awaited: one promise fewer per delivery on the hot path.
    return transaction
      .beginAndClaim([meta.scope, key, meta.source, this.lockTimeout])
      .catch(async (error: unknown) => {
        await rollbackQuietly(transaction);
        const code = errorCode(error);
        if (code === LOCK_NOT_AVAILABLE) return 'in_flight' as const;
        if (RETRYABLE_CODES.has(code ?? '')) throw error;
        this.logger.error(claimFailedLog(meta.scope, key, code, error));
        throw new ClaimUnavailableError(key, code, error);
      });
  }

  private async work<T>(
    transaction: ClaimTransaction,
    meta: IdempotentWebhookMetadata,
    key: string,
    handler: (manager: EntityManager) => Promise<T>,
  ): Promise<T> {
    const started = performance.now();
    try {
      return await handler(transaction.manager);
    } catch (error) {
      await rollbackQuietly(transaction);
      this.metrics.count('failed', meta.scope, key);
      throw error;
    } finally {
      this.warnIfSlow(meta.scope, performance.now() - started);
    }
  }

  private commit(transaction: ClaimTransaction, meta: IdempotentWebhookMetadata, key: string): Promise<void> {
    return transaction.end('COMMIT').catch(async (error: unknown) => {
      if (error instanceof TransactionAbortedError) {
        this.metrics.count('failed', meta.scope, key);
        this.logger.error(transactionAbortedLog(meta.scope, key));
        throw error;
      }
      await rollbackQuietly(transaction);
      const code = errorCode(error);
      // The handler's data was refused at COMMIT (a deferred constraint, say): its failure, as if
      // it had thrown, not an unavailable database.
      if (isDataError(code)) {
        this.metrics.count('failed', meta.scope, key);
        throw error;
      }
      // Nothing is known to be committed: the sender must retry, and the retry is safe either way.
      if (RETRYABLE_CODES.has(code ?? '')) throw error;
      this.logger.error(claimFailedLog(meta.scope, key, code, error));
      throw new ClaimUnavailableError(key, code, error);
    });
  }

  /** Read per delivery: the DataSource may be initialized (subscribers built) after this is constructed. */
  private transactionOptions(): ClaimTransactionOptions {
    return {
      prepared: this.config.preparedStatements,
      isolationLevel: this.dataSource.options.isolationLevel,
      subscribed: this.dataSource.subscribers.length > 0,
    };
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

/** Rolls back if a transaction is open; a lost connection has rolled back on its own. */
async function rollbackQuietly(transaction: ClaimTransaction): Promise<void> {
  try {
    await transaction.end('ROLLBACK');
  } catch {
    // The connection is gone; Postgres rolls the transaction back on its own.
  }
}

/** SQLSTATE classes 22 (data exception) and 23 (integrity constraint violation). */
function isDataError(code: string | undefined): boolean {
  return code !== undefined && (code.startsWith('22') || code.startsWith('23'));
}
