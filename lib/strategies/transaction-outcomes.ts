import { Logger } from '@nestjs/common';
import { AnsweredFailure } from '../core/answered-failure.js';
import {
  fingerprintsConflict,
  type ClaimCheck,
  type ConflictState,
  type StoredResponse,
} from '../core/claim-check.js';
import type { ClaimResult } from '../core/claim-result.js';
import type { ClaimSpec } from '../core/claim-strategy.js';
import { DEFAULTS } from '../idempotency.constants.js';
import {
  EventInFlightError,
  IdempotencyUnavailableError,
  TransactionAbortedError,
} from '../idempotency.errors.js';
import { claimFailedLog, describeError, handlerDatabaseFailedLog } from '../idempotency.messages.js';
import type { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import type { ClaimDatabase } from '../postgres/claim-database.js';
import type { ClaimTransaction, CommitOutcome } from '../postgres/claim-transaction.js';
import { ClaimTakenError } from '../postgres/commit-batch.js';
import { isUsersSubscriber } from '../postgres/outside-write.subscriber.js';
import {
  errorCode,
  errorMessage,
  isConnectionError,
  isRetryable,
  LOCK_NOT_AVAILABLE,
} from '../postgres/pg-errors.js';
import type { ClaimTransactionOptions } from '../postgres/transaction-session.js';
import { pgPoolOf } from '../postgres/typeorm-internals.js';
import { databaseUnavailableError } from './database-unavailable.js';
import type { OrderedClaim } from './event-ordering.js';
import { isRefusal } from './handler-refusal.js';
import type { RetryAfterEstimator } from './retry-after.estimator.js';

const transactionAborted = (key: string) =>
  `Event ${key} was not processed: a statement in its transaction failed, so nothing was committed; retry later`;

const transactionAbortedLog = (scope: string, key: string) =>
  `Handler of ${scope} returned for key ${key} after a statement in its transaction failed; PostgreSQL rolled the COMMIT back and nothing was written. Let database errors propagate, or recover from them inside a nested manager.transaction()`;

const commitAmbiguousLog = (scope: string, key: string, code: string | undefined, error: unknown) =>
  `COMMIT of ${scope} key ${key} may have committed; the redelivery will tell (SQLSTATE ${code ?? 'none'}): ${describeError(error)}`;

const runsAgainLog = (scope: string, key: string, attempt: number, error: unknown) =>
  `${scope} key ${key} runs again (try ${attempt} of ${MAX_TRANSACTION_TRIES}): its transaction rolled back after the handler ran: ${describeError(error)}`;

/** How often a serialization failure or deadlock is retried from scratch (claim and handler). */
export const MAX_TRANSACTION_TRIES = 3;

const slowTransaction = (scope: string, ms: number, limit: number) =>
  `${scope} held its transaction for ${ms} ms (more than ${limit} ms); if it calls something outside the database, mark it @IdempotentWebhook({ external: true })`;

const failureNotRecorded = (scope: string, key: string, error: unknown) =>
  `Could not record the failure of ${scope} key ${key} (${describeError(error)}); the next delivery runs it again all the same`;

/** The slow-transaction warning repeats at most this often per handler. */
const SLOW_WARNING_EVERY_MS = 60_000;

/** The one replayed result: it carries nothing, so every replay shares it. */
const REPLAYED: ClaimResult<never> = { kind: 'replayed' };

/**
 * What transaction mode answers and records for the outcomes of its deliveries, besides the
 * claim itself (TransactionStrategy): replayed, in flight, the database unavailable, a handler's
 * failure recorded outside its rolled-back transaction, the slow-transaction warning, and the
 * options each delivery's transaction runs with. One per strategy.
 */
export class TransactionOutcomes {
  private readonly logger = new Logger('IdempotencyModule');
  private readonly lastSlowWarning = new Map<string, number>();

  constructor(
    private readonly database: ClaimDatabase,
    readonly config: IdempotencyConfig,
    readonly metrics: IdempotencyMetrics,
    readonly retryAfter: RetryAfterEstimator,
    /** lock_timeout of the claim; 0 would mean "wait forever", so 1 ms is the shortest real bound. */
    readonly lockTimeout: string,
  ) {}

  /**
   * Replayed. With key checks, with the claim's stored response, and refused instead when its
   * fingerprint is another delivery's and conflicts are refused.
   */
  replayed(
    spec: ClaimSpec,
    key: string,
    found?: { readonly fingerprint?: string | null; readonly response?: unknown },
    check?: ClaimCheck,
  ): ClaimResult<never> {
    const conflict = check !== undefined && fingerprintsConflict(check.fingerprint, found?.fingerprint);
    if (conflict && check.refuse) return { kind: 'conflict', state: 'done' };
    this.metrics.count('replayed', spec.scope, key);
    if (!check) return REPLAYED;
    return {
      kind: 'replayed',
      ...(found?.response ? { response: found.response as StoredResponse } : {}),
      ...(conflict ? { conflict: 'done' as const } : {}),
    };
  }

  /**
   * In flight: another delivery has held the event for `heldMs`. Retry-After follows how long
   * this scope's deliveries take (RetryAfterEstimator), at most the lease's `secondsLeft` when a
   * lease holds it, else `retryAfterSeconds`.
   */
  inFlight(
    spec: ClaimSpec,
    key: string,
    heldMs: number,
    secondsLeft: number = this.config.retryAfterSeconds,
    conflict?: ConflictState,
  ): ClaimResult<never> {
    this.metrics.count('in_flight', spec.scope, key);
    const retryAfterSeconds = this.retryAfter.seconds(spec.scope, heldMs, secondsLeft);
    return conflict
      ? { kind: 'in_flight', retryAfterSeconds, conflict }
      : { kind: 'in_flight', retryAfterSeconds };
  }

  /** IdempotencyUnavailableError for `error`, logged with `log`: the database failed, retry. */
  unavailable(
    spec: ClaimSpec,
    key: string,
    error: unknown,
    log: (scope: string, key: string, code: string | undefined, error: unknown) => string,
  ) {
    return databaseUnavailableError(
      this.logger,
      (code) => log(spec.scope, key, code, error),
      spec.scope,
      key,
      this.config.retryAfterSeconds,
      error,
    );
  }

  /**
   * Counts a handler's failure and records it outside its rolled-back transaction (attempts and
   * the error), so an event that fails on every delivery shows up as poison in the reporter, as it
   * does in external mode. Best effort: the answer is the failure either way.
   */
  async failed(
    transaction: ClaimTransaction,
    spec: ClaimSpec,
    key: string,
    error: unknown,
    check?: ClaimCheck,
  ): Promise<void> {
    this.metrics.count('failed', spec.scope, key);
    // A handler that answers its input 4xx has refused it on purpose: that writes nothing.
    if (isRefusal(error)) return;
    const message = errorMessage(error).slice(0, DEFAULTS.maxErrorLength);
    const values: unknown[] = [spec.scope, key, spec.source, message, this.lockTimeout];
    // Key checks: the failure keeps the delivery's fingerprint (the checked statement's sixth value).
    const statements = check ? this.database.checkedStatements : this.database.statements;
    if (check) values.push(check.fingerprint);
    try {
      await transaction.afterwards(statements.transactionFailure, values);
    } catch (recordError) {
      // A duplicate holding the claim (lock_timeout) is already retrying the event: nothing to add.
      if (errorCode(recordError) !== LOCK_NOT_AVAILABLE) {
        this.logger.warn(failureNotRecorded(spec.scope, key, recordError));
      }
    }
  }

  /** Warns (at most once a minute per scope) that a delivery held its transaction long. */
  warnIfSlow(scope: string, elapsedMs: number): void {
    if (elapsedMs <= this.config.slowTransactionWarnMs) return;
    const now = Date.now();
    if (now - (this.lastSlowWarning.get(scope) ?? -Infinity) < SLOW_WARNING_EVERY_MS) return;
    this.lastSlowWarning.set(scope, now);
    this.logger.warn(slowTransaction(scope, Math.round(elapsedMs), this.config.slowTransactionWarnMs));
  }

  /**
   * The options of a delivery's transaction, made again only when the DataSource's subscribers
   * change: it may be initialized (subscribers built) after this is constructed, and an object per
   * delivery would be garbage per delivery.
   */
  transactionOptions(checked: boolean): ClaimTransactionOptions {
    const { dataSource } = this.database;
    const subscribers = dataSource.subscribers.length;
    if (this.options === undefined || this.optionsFor !== subscribers) {
      const { statements, checkedStatements, prepared } = this.database;
      const shared = {
        pool: pgPoolOf(dataSource),
        prepared,
        // TypeORM 1.x's default level for every transaction; 0.3 has no such option (undefined).
        isolationLevel: (dataSource.options as { readonly isolationLevel?: string }).isolationLevel,
        // The library's own subscriber (outside-write detection) needs no transaction events.
        subscribed: subscribers > 0 && dataSource.subscribers.some(isUsersSubscriber),
      };
      this.options = {
        plain: { ...shared, statements },
        checked: { ...shared, statements: checkedStatements },
      };
      this.optionsFor = subscribers;
    }
    return checked ? this.options.checked : this.options.plain;
  }

  /** transactionOptions(), made for `optionsFor` subscribers. */
  private options?: { plain: ClaimTransactionOptions; checked: ClaimTransactionOptions };
  private optionsFor = -1;

  /**
   * A delivery's work threw, its transaction rolled back: resolves when it runs again (try
   * `nextAttempt`; 0 when no try is left), else throws its answer: the database unavailable, a
   * claim made inside it in flight or unavailable, or the handler's own error, recorded failed.
   */
  async handlerFailed(
    transaction: ClaimTransaction,
    spec: ClaimSpec,
    key: string,
    error: unknown,
    nextAttempt: number,
    check: ClaimCheck | undefined,
  ): Promise<void> {
    if (nextAttempt > 0 && isRetryable(error)) {
      this.logger.debug(runsAgainLog(spec.scope, key, nextAttempt, error));
      return;
    }
    // A claim at commit whose key another delivery committed meanwhile: the handler may
    // have failed on that one's writes. Run again, which replays it.
    if (nextAttempt > 0 && (await transaction.claimTakenMeanwhile())) {
      const taken = new ClaimTakenError({ cause: error });
      this.logger.debug(runsAgainLog(spec.scope, key, nextAttempt, taken));
      return;
    }
    // A lost connection or lasting contention is not the handler's fault: the redelivery
    // can succeed unchanged. A connection lost while the handler waited between statements
    // surfaces as whatever its next statement threw (TypeORM's "already released"). A
    // handler that answered a 5xx itself meanwhile keeps its answer (AnsweredFailure).
    if (
      !(error instanceof AnsweredFailure) &&
      (isConnectionError(error) || isRetryable(error) || transaction.connectionLost)
    ) {
      this.metrics.count('failed', spec.scope, key);
      throw this.unavailable(spec, key, error, handlerDatabaseFailedLog);
    }
    // A claim made inside the handler found its event in flight or the database away:
    // answered as that (retry later), not recorded as the handler's failure.
    if (error instanceof EventInFlightError || error instanceof IdempotencyUnavailableError) {
      this.metrics.count(error instanceof EventInFlightError ? 'in_flight' : 'failed', spec.scope, key);
      throw error;
    }
    await this.failed(transaction, spec, key, error, check);
    throw error;
  }

  /**
   * A COMMIT that did not commit (CommitOutcome): resolves when the delivery runs again (try
   * `nextAttempt`; 0 when no try is left), else throws its answer: unavailable, the transaction
   * aborted (TransactionAbortedError, recorded failed), or the data refused (recorded failed).
   */
  async commitFailed(
    committed: Exclude<CommitOutcome, { kind: 'committed' }>,
    transaction: ClaimTransaction,
    spec: ClaimSpec,
    key: string,
    nextAttempt: number,
    ordered: OrderedClaim | undefined,
    check: ClaimCheck | undefined,
  ): Promise<void> {
    switch (committed.kind) {
      case 'retry':
        if (nextAttempt > 0) {
          // Ordering guard: a stale event without runStale commits with no handler run.
          if (ordered?.runsHandler !== false) {
            this.logger.debug(runsAgainLog(spec.scope, key, nextAttempt, committed.error));
          }
          return;
        }
        throw this.unavailable(spec, key, committed.error, claimFailedLog);
      case 'rolled_back': {
        this.logger.error(transactionAbortedLog(spec.scope, key));
        const aborted = new TransactionAbortedError(transactionAborted(key), spec.scope, key);
        await this.failed(transaction, spec, key, aborted, check);
        throw aborted;
      }
      case 'refused':
        // The handler's data was refused at COMMIT (a deferred constraint, say): its
        // failure, as if it had thrown, not an unavailable database.
        await this.failed(transaction, spec, key, committed.error, check);
        throw committed.error;
      case 'unknown':
        // The COMMIT was sent and its answer lost: it may have committed. The redelivery
        // tells (replayed if it did, processed if it did not), and is safe either way.
        throw this.unavailable(spec, key, committed.error, commitAmbiguousLog);
    }
  }
}
