import { Inject, Injectable, Logger } from '@nestjs/common';
import { afterCommitFailed } from '../core/after-commit.js';
import { AnsweredFailure } from '../core/answered-failure.js';
import {
  fingerprintsConflict,
  type ClaimCheck,
  type ConflictState,
  type StoredResponse,
} from '../core/claim-check.js';
import type { ClaimResult } from '../core/claim-result.js';
import type { ClaimHandle, ClaimSpec, ClaimStrategy } from '../core/claim-strategy.js';
import { commitFaultsArmed, takeCommitFault } from '../core/commit-faults.js';
import type { EventOrder } from '../core/event-order.js';
import { DEFAULTS, IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import {
  EventInFlightError,
  IdempotencyUnavailableError,
  TransactionAbortedError,
} from '../idempotency.errors.js';
import { claimFailedLog, handlerDatabaseFailedLog } from '../idempotency.messages.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { isUsersSubscriber } from '../postgres/outside-write.subscriber.js';
import { pgPoolOf } from '../postgres/typeorm-internals.js';
import type { ClaimValues } from '../postgres/claim-rounds.js';
import type { ClaimFound } from '../postgres/claim-row.reader.js';
import { ClaimTransaction } from '../postgres/claim-transaction.js';
import { ClaimTakenError } from '../postgres/commit-batch.js';
import type { ClaimTransactionOptions } from '../postgres/transaction-session.js';
import {
  errorCode,
  errorMessage,
  isConnectionError,
  isRetryable,
  LOCK_NOT_AVAILABLE,
} from '../postgres/pg-errors.js';
import { databaseUnavailableError } from './database-unavailable.js';
import { OrderedClaim } from './event-ordering.js';
import { isRefusal } from './handler-refusal.js';
import { InProcessWaiters } from './in-process-waiters.js';
import { RetryAfterEstimator } from './retry-after.estimator.js';
import { describeError } from '../idempotency.messages.js';

const transactionAborted = (key: string) =>
  `Event ${key} was not processed: a statement in its transaction failed, so nothing was committed; retry later`;

const transactionAbortedLog = (scope: string, key: string) =>
  `Handler of ${scope} returned for key ${key} after a statement in its transaction failed; PostgreSQL rolled the COMMIT back and nothing was written. Let database errors propagate, or recover from them inside a nested manager.transaction()`;

const slowTransaction = (scope: string, ms: number, limit: number) =>
  `${scope} held its transaction for ${ms} ms (more than ${limit} ms); if it calls something outside the database, mark it @IdempotentWebhook({ external: true })`;

const commitAmbiguousLog = (scope: string, key: string, code: string | undefined, error: unknown) =>
  `COMMIT of ${scope} key ${key} may have committed; the redelivery will tell (SQLSTATE ${code ?? 'none'}): ${describeError(error)}`;

const runsAgainLog = (scope: string, key: string, attempt: number, error: unknown) =>
  `${scope} key ${key} runs again (try ${attempt} of ${MAX_TRANSACTION_TRIES}): its transaction rolled back after the handler ran: ${describeError(error)}`;

const failureNotRecorded = (scope: string, key: string, error: unknown) =>
  `Could not record the failure of ${scope} key ${key} (${describeError(error)}); the next delivery runs it again all the same`;

/** How often a serialization failure or deadlock is retried from scratch (claim and handler). */
const MAX_TRANSACTION_TRIES = 3;
/** The slow-transaction warning repeats at most this often per handler. */
const SLOW_WARNING_EVERY_MS = 60_000;

/**
 * Transaction mode: the claim and everything the handler writes through the transaction's
 * EntityManager commit together. A crash or a throw rolls both back and the next delivery claims
 * cleanly. A concurrent duplicate waits for the first delivery for at most
 * `concurrentDuplicateWaitMs` (in memory in this process, on the claim's row lock elsewhere, or
 * on its key's advisory lock for a request-mode claim, whose row its COMMIT writes): it then sees
 * the commit (replayed), the rollback (claims and runs), or neither (in flight). A claim made while
 * a transaction-mode delivery runs joins that delivery's transaction in a savepoint.
 */
@Injectable()
export class TransactionStrategy implements ClaimStrategy {
  private readonly logger = new Logger('IdempotencyModule');
  private readonly lastSlowWarning = new Map<string, number>();
  private readonly waiters = new InProcessWaiters();
  /** lock_timeout of the claim; 0 would mean "wait forever", so 1 ms is the shortest real bound. */
  private readonly lockTimeout: string;

  constructor(
    private readonly database: ClaimDatabase,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
    private readonly retryAfter: RetryAfterEstimator,
  ) {
    this.lockTimeout = `${Math.max(1, Math.ceil(config.concurrentDuplicateWaitMs))}ms`;
  }

  /**
   * Claims `key`, runs `work` in the claim's transaction and commits both, or neither. Inside
   * another transaction-mode delivery (`enclosing`), in that delivery's transaction instead. With
   * `order` (an `@IdempotentWebhook` ordering guard), the claim checks and advances the entity's
   * version too; a webhook delivery is never made inside another, so a joined claim has none.
   */
  run<T>(
    spec: ClaimSpec,
    key: string,
    work: (handle: ClaimHandle) => Promise<T>,
    enclosing?: ClaimHandle,
    check?: ClaimCheck,
    order?: EventOrder,
  ): Promise<ClaimResult<T>> {
    // A delivery made by the testing helpers has no claim transaction to join: it claims on its own.
    // A joined claim is an inner one (@Idempotent, run()): it has no key checks.
    if (enclosing instanceof ClaimTransaction) return this.joinEnclosing(enclosing, spec, key, work);
    // Key checks need the table's fingerprint and response columns (ClaimDatabase.keyChecks).
    const checked =
      check !== undefined && spec.checks !== undefined && this.database.keyChecks ? check : undefined;
    const id = `${spec.scope}\u0000${key}`;
    if (this.waiters.has(id)) return this.afterFirst(id, spec, key, work, checked, order);
    return this.claimAndRun(id, spec, key, work, checked, order);
  }

  /**
   * A duplicate of a delivery this process is already running waits for it, within its own
   * bound. A commit answers it at once; otherwise the first waiter to wake claims in its place.
   */
  private async afterFirst<T>(
    id: string,
    spec: ClaimSpec,
    key: string,
    work: (handle: ClaimHandle) => Promise<T>,
    check: ClaimCheck | undefined,
    order: EventOrder | undefined,
  ): Promise<ClaimResult<T>> {
    // Key checks: a duplicate of another fingerprint than the running delivery's is refused now.
    if (check?.refuse && fingerprintsConflict(check.fingerprint, this.waiters.fingerprintOf(id))) {
      return { kind: 'conflict', state: 'in_flight' };
    }
    const deadline = performance.now() + this.config.concurrentDuplicateWaitMs;
    while (this.waiters.has(id)) {
      const { outcome, committed } = await this.waiters.waitFor(id, deadline - performance.now());
      if (outcome === 'timeout') return this.inFlight(spec, key, this.waiters.heldMs(id));
      // Key checks: the first handed over its fingerprint and response; no round trip either way.
      if (outcome === 'committed') return this.replayed(spec, key, committed, check);
    }
    return this.claimAndRun(id, spec, key, work, check, order);
  }

  /**
   * A delivery, top to bottom: begin and claim (the Postgres side says what it found), run the
   * work, commit (it says how that ended), and each outcome is answered where it is met. One
   * function with its error handling inline, rather than a helper per step: every async layer is
   * a promise on every delivery, and under AsyncLocalStorage every promise pays its hooks. Each
   * delivery counts exactly one outcome, after its last try.
   */
  private async claimAndRun<T>(
    id: string,
    spec: ClaimSpec,
    key: string,
    work: (handle: ClaimHandle) => Promise<T>,
    check: ClaimCheck | undefined,
    order: EventOrder | undefined,
  ): Promise<ClaimResult<T>> {
    // Registered before the first await, so a duplicate arriving meanwhile finds it.
    this.waiters.begin(id, check?.fingerprint);
    // Key checks: the checked statements, which take the fingerprint last.
    const values: ClaimValues = check
      ? [spec.scope, key, spec.source, this.lockTimeout, check.fingerprint]
      : [spec.scope, key, spec.source, this.lockTimeout];
    // Ordering guard (event-ordering.ts): the claim is sent as the ordered claim, which checks and
    // advances the entity's version in the same statement; it says whether the event is stale.
    const ordered =
      order &&
      new OrderedClaim(
        check ? this.database.checkedOrdered : this.database.ordered,
        order,
        check !== undefined,
      );
    let done: ClaimTransaction | undefined;
    let value: T | undefined;
    // Key checks: a failed claim of another fingerprint, taken over ('warn'), is reported.
    let conflict: ConflictState | undefined;
    try {
      // A retry re-runs claim and handler in a fresh transaction: replaying recorded SQL is not enough.
      for (let attempt = 1; ; attempt++) {
        const retriesLeft = attempt < MAX_TRANSACTION_TRIES;
        const transaction = new ClaimTransaction(
          this.database.dataSource,
          this.transactionOptions(check !== undefined),
        );
        try {
          // 1. Begin and claim.
          const started = performance.now();
          let found: ClaimFound;
          try {
            // Two awaits, the pool's and the claim's, and no async layer between them and the wire.
            found = await transaction.beginAndClaim(
              await transaction.connect(),
              values,
              check,
              ordered,
              check?.storesResponse,
            );
          } catch (error) {
            await transaction.rollbackQuietly();
            // Another delivery (at another replica) held the claim past concurrentDuplicateWaitMs.
            if (errorCode(error) === LOCK_NOT_AVAILABLE) {
              return this.inFlight(spec, key, this.config.concurrentDuplicateWaitMs);
            }
            // ClaimTakenError: a claim at commit waited under a snapshot too old to see the holder's commit.
            if (retriesLeft && (isRetryable(error) || error instanceof ClaimTakenError)) continue;
            throw this.unavailable(spec, key, error, claimFailedLog);
          }
          if (found.kind !== 'claimed') {
            try {
              await transaction.end('ROLLBACK');
            } catch (error) {
              throw this.unavailable(spec, key, error, claimFailedLog);
            }
            if (found.kind === 'done') return this.replayed(spec, key, found, check);
            if (found.kind === 'conflict') return { kind: 'conflict', state: found.state };
            // A live lease of the other mode on the same scope: its work is unfinished.
            return this.inFlight(spec, key, found.heldMs, found.secondsLeft, found.conflict);
          }

          // 2. The work, in the claim's transaction. Ordering guard: a stale event's only with runStale.
          if (ordered?.stale) transaction.stale = true;
          try {
            value = ordered && !ordered.runsHandler ? undefined : await work(transaction);
          } catch (error) {
            this.warnIfSlow(spec.scope, performance.now() - started);
            await transaction.rollbackQuietly();
            if (retriesLeft && isRetryable(error)) {
              this.logger.debug(runsAgainLog(spec.scope, key, attempt + 1, error));
              continue;
            }
            // A claim at commit whose key another delivery committed meanwhile: the handler may
            // have failed on that one's writes. Run again, which replays it.
            if (retriesLeft && (await transaction.claimTakenMeanwhile())) {
              const taken = new ClaimTakenError({ cause: error });
              this.logger.debug(runsAgainLog(spec.scope, key, attempt + 1, taken));
              continue;
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
              this.metrics.count(
                error instanceof EventInFlightError ? 'in_flight' : 'failed',
                spec.scope,
                key,
              );
              throw error;
            }
            await this.failed(transaction, spec, key, error, check);
            throw error;
          }
          this.warnIfSlow(spec.scope, performance.now() - started);

          // 3. Commit.
          const committed = await transaction.commit(commitFaultsArmed() && takeCommitFault(spec.scope, key));
          switch (committed.kind) {
            case 'committed':
              this.retryAfter.record(spec.scope, performance.now() - started);
              if (ordered?.stale) {
                // Ordering guard: the claim is done, the entity's version unchanged.
                this.metrics.count('stale', spec.scope, key);
                ordered.logCommitted(this.logger, spec.scope, key);
              } else {
                this.metrics.count(found.reclaimed ? 'reclaimed' : 'claimed', spec.scope, key);
              }
              conflict = found.conflict;
              done = transaction;
              break;
            case 'retry':
              if (retriesLeft) {
                // Ordering guard: a stale event without runStale commits with no handler run.
                if (ordered?.runsHandler !== false) {
                  this.logger.debug(runsAgainLog(spec.scope, key, attempt + 1, committed.error));
                }
                continue;
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
          break;
        } finally {
          transaction.release();
        }
      }
    } finally {
      // Key checks: what this delivery stored, for the duplicates waiting on it.
      const committed =
        done && check ? { fingerprint: check.fingerprint, response: done.recordedResponse } : undefined;
      this.waiters.end(id, done ? 'committed' : 'not_committed', committed);
    }
    // 4. After the connection went back to the pool: the callbacks are not part of the transaction.
    if (done.hasAfterCommit) {
      await done.runAfterCommit((error) => this.logger.error(afterCommitFailed(spec.scope, key, error)));
    }
    if (ordered?.stale) return conflict ? { kind: 'stale', value, conflict } : { kind: 'stale', value };
    return conflict
      ? { kind: 'processed', value: value as T, conflict }
      : { kind: 'processed', value: value as T };
  }

  /**
   * A claim made while a transaction-mode delivery runs, in that delivery's transaction: a
   * savepoint and the claim in one round trip, then the work on the same connection. Success
   * leaves the savepoint for the enclosing COMMIT (it commits both, or neither); a failure rolls
   * back to it, so the enclosing delivery can catch the error and go on. Counted when the
   * enclosing transaction commits, as that is when the claim exists.
   */
  private async joinEnclosing<T>(
    transaction: ClaimTransaction,
    spec: ClaimSpec,
    key: string,
    work: (handle: ClaimHandle) => Promise<T>,
  ): Promise<ClaimResult<T>> {
    const savepoint = transaction.savepoint();
    const started = performance.now();
    let found: ClaimFound;
    try {
      // The enclosing transaction's statements: the checked claim takes a (null) fingerprint too.
      const values: ClaimValues = transaction.checked
        ? [spec.scope, key, spec.source, this.lockTimeout, null]
        : [spec.scope, key, spec.source, this.lockTimeout];
      found = await transaction.claimAt(savepoint, values);
    } catch (error) {
      await transaction.rollbackTo(savepoint).catch(() => undefined);
      if (errorCode(error) === LOCK_NOT_AVAILABLE) {
        return this.inFlight(spec, key, this.config.concurrentDuplicateWaitMs);
      }
      throw this.unavailable(spec, key, error, claimFailedLog);
    }
    if (found.kind !== 'claimed') {
      // Nothing was claimed, but the claim bounded the transaction's lock_timeout to a
      // duplicate's wait: rolling back to the savepoint puts the enclosing delivery's back.
      try {
        await transaction.rollbackTo(savepoint);
      } catch (error) {
        throw this.unavailable(spec, key, error, claimFailedLog);
      }
      if (found.kind === 'done') return this.replayed(spec, key);
      if (found.kind === 'conflict') return { kind: 'conflict', state: found.state };
      return this.inFlight(spec, key, found.heldMs, found.secondsLeft);
    }
    let value: T;
    try {
      value = await work(transaction);
    } catch (error) {
      // Should the connection be gone, the enclosing delivery fails on it anyway.
      await transaction.rollbackTo(savepoint).catch(() => undefined);
      this.metrics.count('failed', spec.scope, key);
      throw error;
    }
    const outcome = found.reclaimed ? 'reclaimed' : 'claimed';
    transaction.afterCommit(() => {
      this.retryAfter.record(spec.scope, performance.now() - started);
      this.metrics.count(outcome, spec.scope, key);
    });
    return { kind: 'processed', value };
  }

  /**
   * Replayed. With key checks, with the claim's stored response, and refused instead when its
   * fingerprint is another delivery's and conflicts are refused.
   */
  private replayed(
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
  private inFlight(
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

  private unavailable(
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
   * The options of a delivery's transaction, made again only when the DataSource's subscribers
   * change: it may be initialized (subscribers built) after this is constructed, and an object per
   * delivery would be garbage per delivery.
   */
  private transactionOptions(checked: boolean): ClaimTransactionOptions {
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
   * Counts a handler's failure and records it outside its rolled-back transaction (attempts and
   * the error), so an event that fails on every delivery shows up as poison in the reporter, as it
   * does in external mode. Best effort: the answer is the failure either way.
   */
  private async failed(
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

  private warnIfSlow(scope: string, elapsedMs: number): void {
    if (elapsedMs <= this.config.slowTransactionWarnMs) return;
    const now = Date.now();
    if (now - (this.lastSlowWarning.get(scope) ?? -Infinity) < SLOW_WARNING_EVERY_MS) return;
    this.lastSlowWarning.set(scope, now);
    this.logger.warn(slowTransaction(scope, Math.round(elapsedMs), this.config.slowTransactionWarnMs));
  }
}

/** The one replayed result: it carries nothing, so every replay shares it. */
const REPLAYED: ClaimResult<never> = { kind: 'replayed' };
