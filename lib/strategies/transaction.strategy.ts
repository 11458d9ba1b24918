import { Inject, Injectable, Logger } from '@nestjs/common';
import { afterCommitFailed } from '../core/after-commit.js';
import { fingerprintsConflict, type ClaimCheck, type ConflictState } from '../core/claim-check.js';
import type { ClaimResult } from '../core/claim-result.js';
import type { ClaimHandle, ClaimRun, ClaimSpec, ClaimStrategy } from '../core/claim-strategy.js';
import { commitFaultsArmed, takeCommitFault } from '../core/commit-faults.js';
import type { EventOrder } from '../core/event-order.js';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import { claimFailedLog } from '../idempotency.messages.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import type { ClaimValues } from '../postgres/claim-rounds.js';
import type { ClaimFound } from '../postgres/claim-row.reader.js';
import { ClaimTransaction } from '../postgres/claim-transaction.js';
import { ClaimTakenError } from '../postgres/commit-batch.js';
import { errorCode, isRetryable, LOCK_NOT_AVAILABLE } from '../postgres/pg-errors.js';
import { OrderedClaim } from './event-ordering.js';
import { InProcessWaiters } from './in-process-waiters.js';
import { joinEnclosing } from './joined-claim.js';
import { RetryAfterEstimator } from './retry-after.estimator.js';
import { MAX_TRANSACTION_TRIES, TransactionOutcomes } from './transaction-outcomes.js';

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
  private readonly waiters = new InProcessWaiters();
  /** Answers and records the outcomes (and makes each transaction's options). */
  private readonly outcomes: TransactionOutcomes;

  constructor(
    private readonly database: ClaimDatabase,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
    private readonly retryAfter: RetryAfterEstimator,
  ) {
    // lock_timeout of the claim; 0 would mean "wait forever", so 1 ms is the shortest real bound.
    const lockTimeout = `${Math.max(1, Math.ceil(config.concurrentDuplicateWaitMs))}ms`;
    this.outcomes = new TransactionOutcomes(database, config, metrics, retryAfter, lockTimeout);
  }

  /**
   * Claims `key`, runs `work` in the claim's transaction and commits both, or neither. Inside
   * another transaction-mode delivery (`enclosing`), in that delivery's transaction instead. With
   * `order` (an `@IdempotentWebhook` ordering guard), the claim checks and advances the entity's
   * version too; a webhook delivery is never made inside another, so a joined claim has none.
   */
  run<T>({ spec, key, work, enclosing, check, order }: ClaimRun<T>): Promise<ClaimResult<T>> {
    // A delivery made by the testing helpers has no claim transaction to join: it claims on its own.
    // A joined claim is an inner one (@Idempotent, run()): it has no key checks.
    if (enclosing instanceof ClaimTransaction)
      return joinEnclosing(this.outcomes, enclosing, spec, key, work);
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
      if (outcome === 'timeout') return this.outcomes.inFlight(spec, key, this.waiters.heldMs(id));
      // Key checks: the first handed over its fingerprint and response; no round trip either way.
      if (outcome === 'committed') return this.outcomes.replayed(spec, key, committed, check);
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
    const { scope, source } = spec;
    const { lockTimeout } = this.outcomes;
    const values: ClaimValues = check
      ? { scope, key, source, lockTimeout, fingerprint: check.fingerprint }
      : { scope, key, source, lockTimeout };
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
          this.outcomes.transactionOptions(check !== undefined),
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
              return this.outcomes.inFlight(spec, key, this.config.concurrentDuplicateWaitMs);
            }
            // ClaimTakenError: a claim at commit waited under a snapshot too old to see the holder's commit.
            if (retriesLeft && (isRetryable(error) || error instanceof ClaimTakenError)) continue;
            throw this.outcomes.unavailable(spec, key, error, claimFailedLog);
          }
          if (found.kind !== 'claimed') {
            try {
              await transaction.end('ROLLBACK');
            } catch (error) {
              throw this.outcomes.unavailable(spec, key, error, claimFailedLog);
            }
            if (found.kind === 'done') return this.outcomes.replayed(spec, key, found, check);
            if (found.kind === 'conflict') return { kind: 'conflict', state: found.state };
            // A live lease of the other mode on the same scope: its work is unfinished.
            return this.outcomes.inFlight(spec, key, found.heldMs, found.secondsLeft, found.conflict);
          }

          // 2. The work, in the claim's transaction. Ordering guard: a stale event's only with runStale.
          if (ordered?.stale) transaction.stale = true;
          try {
            value = ordered && !ordered.runsHandler ? undefined : await work(transaction);
          } catch (error) {
            this.outcomes.warnIfSlow(spec.scope, performance.now() - started);
            await transaction.rollbackQuietly();
            // Resolves when the delivery runs again; else throws its answer.
            await this.outcomes.handlerFailed(
              transaction,
              spec,
              key,
              error,
              retriesLeft ? attempt + 1 : 0,
              check,
            );
            continue;
          }
          this.outcomes.warnIfSlow(spec.scope, performance.now() - started);

          // 3. Commit.
          const committed = await transaction.commit(commitFaultsArmed() && takeCommitFault(spec.scope, key));
          if (committed.kind !== 'committed') {
            // Resolves when the delivery runs again; else throws its answer.
            const next = retriesLeft ? attempt + 1 : 0;
            await this.outcomes.commitFailed(committed, transaction, spec, key, next, ordered, check);
            continue;
          }
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
}
