import { Inject, Injectable, Logger } from '@nestjs/common';
import type { DataSource, EntityManager } from 'typeorm';
import { IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';
import { slowTransaction, transactionAbortedLog } from '../idempotency.messages.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig, IdempotentWebhookMetadata } from '../interfaces/index.js';
import {
  claimUnavailable,
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
  /** Deliveries of this process that are claiming or running, by (scope, key), with their waiting duplicates. */
  private readonly inFlight = new Map<string, (() => void)[]>();
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
    const waiting = this.inFlight.get(id);
    if (waiting) return this.afterFirst(waiting, id, meta, key, handler);
    return this.claimAndRun(meta, key, handler, id);
  }

  /**
   * A duplicate of a delivery this process is already running waits for it here, holding no
   * pool connection: a storm of duplicates then cannot starve unrelated events. Duplicates
   * arriving at other replicas still wait in Postgres, bounded by lock_timeout. When the first
   * finishes without committing (its own wait ran out, or it failed), one waiter takes its place
   * and the rest wait on that one, within what is left of their own bound: never a herd of
   * duplicates each holding a connection on the same row lock.
   */
  private async afterFirst<T>(
    waiting: (() => void)[],
    id: string,
    meta: IdempotentWebhookMetadata,
    key: string,
    handler: (manager: EntityManager) => Promise<T>,
  ): Promise<ClaimResult<T>> {
    const deadline = performance.now() + this.config.concurrentDuplicateWaitMs;
    for (let current: (() => void)[] | undefined = waiting; current; current = this.inFlight.get(id)) {
      if (!(await settlesWithin(current, deadline - performance.now()))) {
        return this.answerInFlight(meta, key);
      }
    }
    return this.claimAndRun(meta, key, handler, id);
  }

  /**
   * One function with its error handling inline, rather than a helper per step: every async
   * layer is a promise on every delivery, and under AsyncLocalStorage every promise pays its hooks.
   */
  private async claimAndRun<T>(
    meta: IdempotentWebhookMetadata,
    key: string,
    handler: (manager: EntityManager) => Promise<T>,
    /** Under which duplicates in this process find and wait for this delivery. */
    id: string,
  ): Promise<ClaimResult<T>> {
    // Registered before the first await, so a duplicate arriving meanwhile finds it; the waiters
    // are plain callbacks, so the first delivery pays no promise for them.
    this.inFlight.set(id, []);
    try {
      // A retry re-runs claim and handler in a fresh transaction: replaying recorded SQL is not enough.
      for (let attempt = 1; ; attempt++) {
        const transaction = new ClaimTransaction(
          this.dataSource.createQueryRunner(),
          this.transactionOptions(),
        );
        try {
          let claimed: boolean;
          try {
            claimed = await transaction.beginAndClaim([meta.scope, key, meta.source, this.lockTimeout]);
          } catch (error) {
            await rollbackQuietly(transaction);
            // Another delivery held the claim past concurrentDuplicateWaitMs.
            if (errorCode(error) === LOCK_NOT_AVAILABLE) return this.answerInFlight(meta, key);
            throw this.unavailable(meta, key, error);
          }
          if (!claimed) {
            await transaction.end('ROLLBACK');
            this.metrics.count('replayed', meta.scope, key);
            return { kind: 'replayed' };
          }

          const started = performance.now();
          let value: T;
          try {
            value = await handler(transaction.manager);
          } catch (error) {
            await rollbackQuietly(transaction);
            this.metrics.count('failed', meta.scope, key);
            throw error;
          } finally {
            this.warnIfSlow(meta.scope, performance.now() - started);
          }

          try {
            await transaction.end('COMMIT');
          } catch (error) {
            throw await this.commitFailed(transaction, meta, key, error);
          }
          this.metrics.count('claimed', meta.scope, key);
          return { kind: 'processed', value };
        } catch (error) {
          if (attempt < MAX_TRANSACTION_TRIES && RETRYABLE_CODES.has(errorCode(error) ?? '')) continue;
          throw error;
        } finally {
          await transaction.release();
        }
      }
    } finally {
      const waiting = this.inFlight.get(id) ?? [];
      this.inFlight.delete(id);
      for (const wake of waiting) wake();
    }
  }

  private answerInFlight(meta: IdempotentWebhookMetadata, key: string): ClaimResult<never> {
    this.metrics.count('in_flight', meta.scope, key);
    return { kind: 'in_flight', retryAfterSeconds: this.config.retryAfterSeconds };
  }

  /** What to throw for a claim or commit the database refused: retryable codes pass through for a retry. */
  private unavailable(meta: IdempotentWebhookMetadata, key: string, error: unknown): unknown {
    if (RETRYABLE_CODES.has(errorCode(error) ?? '')) return error;
    return claimUnavailable(this.logger, meta.scope, key, error);
  }

  /** What to throw for a failed COMMIT. */
  private async commitFailed(
    transaction: ClaimTransaction,
    meta: IdempotentWebhookMetadata,
    key: string,
    error: unknown,
  ): Promise<unknown> {
    if (error instanceof TransactionAbortedError) {
      this.metrics.count('failed', meta.scope, key);
      this.logger.error(transactionAbortedLog(meta.scope, key));
      return error;
    }
    await rollbackQuietly(transaction);
    // The handler's data was refused at COMMIT (a deferred constraint, say): its failure, as if
    // it had thrown, not an unavailable database.
    if (isDataError(errorCode(error))) {
      this.metrics.count('failed', meta.scope, key);
      return error;
    }
    // Nothing is known to be committed: the sender must retry, and the retry is safe either way.
    return this.unavailable(meta, key, error);
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

/** Resolves true once the delivery `waiting` belongs to finishes (either way), false if `ms` passes first. */
function settlesWithin(waiting: (() => void)[], ms: number): Promise<boolean> {
  if (ms <= 0) return Promise.resolve(false);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    waiting.push(() => {
      clearTimeout(timer);
      resolve(true);
    });
  });
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
