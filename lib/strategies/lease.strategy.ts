import { randomUUID } from 'node:crypto';
import { Inject, Injectable, Logger, type OnModuleDestroy } from '@nestjs/common';
import { afterCommitFailed } from '../core/after-commit.js';
import { fingerprintsConflict, type ClaimCheck, type StoredResponse } from '../core/claim-check.js';
import type { ClaimResult } from '../core/claim-result.js';
import type { ClaimSpec, ClaimStrategy, ClaimRun } from '../core/claim-strategy.js';
import { commitFaultsArmed, takeCommitFault } from '../core/commit-faults.js';
import { DEFAULTS, IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import { claimFailedLog, handlerDatabaseFailedLog } from '../idempotency.messages.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { errorCode, errorMessage, isConnectionError, LOCK_NOT_AVAILABLE } from '../postgres/pg-errors.js';
import type { ClaimStatement } from '../postgres/statement-executor.js';
import { databaseUnavailableError } from './database-unavailable.js';
import { isRefusal } from './handler-refusal.js';
import { LeaseHandle } from './lease-handle.js';
import { RetryAfterEstimator } from './retry-after.estimator.js';
import { describeError } from '../idempotency.messages.js';

const leaseLost = (scope: string, key: string, mine: number, current: number | undefined) =>
  `Lease lost: ${scope} key ${key} finished attempt ${mine} after its lease was taken over (current attempt ${current ?? 'unknown'}); the side effect may have run twice`;

const completionFailed = (scope: string, key: string, error: unknown) =>
  `Could not mark ${scope} key ${key} done after its handler succeeded: ${describeError(error)}; the lease will expire and be reported`;

const releaseFailed = (scope: string, key: string, error: unknown) =>
  `Could not mark ${scope} key ${key} failed: ${describeError(error)}; it becomes claimable when its lease expires`;

const heartbeatFailed = (scope: string, key: string, error: unknown) =>
  `Heartbeat of ${scope} key ${key} failed: ${describeError(error)}`;

/**
 * Claims between the lease claim and its state read can change hands (a lease expires, a holder
 * fails); a few rounds settle it.
 */
const MAX_CLAIM_ROUNDS = 3;

/**
 * Pauses between rounds of a fenced update's resends while the database stays unreachable:
 * doubling from the first, capped at the last, until the lease this process holds runs out.
 */
const RESEND_PAUSE_MS = 100;
const MAX_RESEND_PAUSE_MS = 1_000;

/** Logged when a failure mark could not be sent and goes on being sent after the answer. */
const failureMarkPending = (scope: string, key: string, error: unknown) =>
  `Could not mark ${key} (${scope}) failed yet (${errorMessage(error)}); sending it again until the ` +
  `database answers or the lease runs out, so the next delivery can claim the event at once`;

/** Logged when a refused delivery's claim could not be removed: it expires with its lease. */
const refusalNotRemoved = (scope: string, key: string, error: unknown) =>
  `Could not remove the claim of ${key} (${scope}) after its handler refused it ` +
  `(${errorMessage(error)}); it becomes claimable when its lease expires`;

/** The claim's lock_timeout ran out: another delivery holds the row (answered in flight). */
class LockWaitExceeded extends Error {}

/**
 * External mode: a three-state claim for work that leaves the database. A live lease held
 * elsewhere is answered in flight (never success for unfinished work); an expired lease or a
 * failed attempt is re-claimed under a new fencing token, and only the current token holder can
 * mark the event done.
 */
@Injectable()
export class LeaseStrategy implements ClaimStrategy, OnModuleDestroy {
  private readonly logger = new Logger('IdempotencyModule');
  /** Aborted at shutdown: failure marks still being resent stop, and their leases expire. */
  private readonly stopping = new AbortController();

  /** lock_timeout of the claim, as transaction mode's: 0 would mean "wait forever". */
  private readonly lockTimeout: string;

  constructor(
    private readonly database: ClaimDatabase,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
    private readonly retryAfter: RetryAfterEstimator,
  ) {
    this.lockTimeout = `${Math.max(1, Math.ceil(config.concurrentDuplicateWaitMs))}ms`;
  }

  onModuleDestroy(): void {
    this.stopping.abort();
  }

  /** Claims a lease (a lease never joins an enclosing delivery, and has no ordering guard). */
  async run<T>({ spec, key, work, check }: ClaimRun<T>): Promise<ClaimResult<T>> {
    const leaseMs = spec.leaseMs ?? this.config.leaseMs;
    // Key checks need the table's fingerprint and response columns (ClaimDatabase.keyChecks).
    const checked =
      check !== undefined && spec.checks !== undefined && this.database.keyChecks ? check : undefined;
    // When the lease ends at the latest, by this process's clock: the database's expiry is its
    // now() at the claim (or renewal) plus the lease, which comes after the send began.
    const claimSent = performance.now();
    const claim = await this.claim(spec, key, leaseMs, checked);
    if (claim.kind !== 'claimed') return claim;

    const { token, attempt } = claim;
    this.metrics.count(attempt === 1 ? 'claimed' : 'reclaimed', spec.scope, key);
    const handle: LeaseHandle = new LeaseHandle(
      spec.scope,
      key,
      token,
      attempt,
      claimSent + leaseMs,
      async (ms = leaseMs) => {
        const sent = performance.now();
        const held = await this.extend(spec, key, token, ms);
        if (held) handle.leaseUntil(sent + ms);
        else handle.lost();
        return held;
      },
    );
    const heartbeat = spec.heartbeat ? this.startHeartbeat(spec, key, handle, leaseMs) : undefined;
    let value: T;
    try {
      value = await work(handle);
    } catch (error) {
      clearInterval(heartbeat);
      handle.finish();
      if (isRefusal(error)) {
        await this.refuse(spec, key, token, attempt);
        throw error;
      }
      await this.fail(spec, key, token, attempt, error, handle.leaseEnds);
      // A lost connection is not the handler's fault: the redelivery can succeed unchanged.
      if (isConnectionError(error)) {
        throw databaseUnavailableError(
          this.logger,
          (code) => handlerDatabaseFailedLog(spec.scope, key, code, error),
          spec.scope,
          key,
          this.config.retryAfterSeconds,
          error,
        );
      }
      throw error;
    }
    clearInterval(heartbeat);
    handle.finish();
    // A test's crashBeforeCommit(): the work happened and its completion never will, as when the
    // process dies here. The lease stays in progress until it expires.
    if (commitFaultsArmed() && takeCommitFault(spec.scope, key)) {
      throw databaseUnavailableError(
        this.logger,
        () => completionFailed(spec.scope, key, 'crashBeforeCommit()'),
        spec.scope,
        key,
        this.config.retryAfterSeconds,
        new Error('crashBeforeCommit(): the completion was not sent'),
      );
    }
    if (
      await this.complete(spec, key, token, attempt, handle.leaseEnds, checked && (handle.response ?? null))
    ) {
      this.retryAfter.record(spec.scope, performance.now() - claimSent);
      if (handle.hasAfterCommit) {
        await handle.runAfterCommit((error) => this.logger.error(afterCommitFailed(spec.scope, key, error)));
      }
    }
    return { kind: 'processed', value };
  }

  private async claim(
    spec: ClaimSpec,
    key: string,
    leaseMs: number,
    check?: ClaimCheck,
  ): Promise<{ kind: 'claimed'; token: string; attempt: number } | ClaimResult<never>> {
    // Key checks: the checked statements take the fingerprint and whether conflicts are refused last.
    const statements = check ? this.database.checkedStatements : this.database.statements;
    const { leaseClaim, claimState } = statements;
    for (let round = 1; ; round++) {
      // One token per claim, kept when the claim is resent after a lost connection: the resend
      // then takes back its own lease (see ClaimStatements.leaseClaim).
      const token = randomUUID();
      const parameters: unknown[] = [spec.scope, key, spec.source, token, leaseMs, this.lockTimeout];
      if (check) parameters.push(check.fingerprint, check.refuse);
      let rows: Record<string, any>[];
      try {
        rows = await this.query(spec, key, leaseClaim, parameters);
      } catch (error) {
        if (!(error instanceof LockWaitExceeded)) throw error;
        // An open transaction-mode claim of the scope held the row past concurrentDuplicateWaitMs.
        this.metrics.count('in_flight', spec.scope, key);
        const { concurrentDuplicateWaitMs, retryAfterSeconds } = this.config;
        return {
          kind: 'in_flight',
          retryAfterSeconds: this.retryAfter.seconds(
            spec.scope,
            concurrentDuplicateWaitMs,
            retryAfterSeconds,
          ),
        };
      }
      if (rows[0]?.claimed) return { kind: 'claimed', token, attempt: Number(rows[0].attempts) };
      // Nothing claimed: done, or held by a live lease, or gone since the conflict. Read which.
      const [state] = await this.query(spec, key, claimState, [spec.scope, key]);
      // Key checks: a claim of another fingerprint (done, failed, or a lease) is refused, or
      // answered as usual and reported.
      const conflict = check !== undefined && fingerprintsConflict(check.fingerprint, state?.fingerprint);
      if (conflict && check.refuse && state) {
        const live = state.status === 'in_progress';
        return { kind: 'conflict', state: state.status === 'done' ? 'done' : live ? 'in_flight' : 'failed' };
      }
      if (state?.status === 'done') {
        this.metrics.count('replayed', spec.scope, key);
        if (!check) return { kind: 'replayed' };
        return {
          kind: 'replayed',
          ...(state.response ? { response: state.response as StoredResponse } : {}),
          ...(conflict ? { conflict: 'done' as const } : {}),
        };
      }
      // Gone (retention), failed or expired since the claim: claim again. Still live: in flight.
      if ((state?.status === 'in_progress' && state.live) || round >= MAX_CLAIM_ROUNDS) {
        this.metrics.count('in_flight', spec.scope, key);
        const live = state?.status === 'in_progress' && state.live;
        const retryAfterSeconds = live
          ? this.retryAfter.seconds(spec.scope, Number(state.held_ms), Number(state.seconds_left))
          : 1;
        return conflict
          ? { kind: 'in_flight', retryAfterSeconds, conflict: 'in_flight' }
          : { kind: 'in_flight', retryAfterSeconds };
      }
    }
  }

  /**
   * Marks the event done; true when it is. The work has happened: a completion that does not land
   * before the lease expires lets a redelivery re-claim the event and run it a second time. So
   * while the database is unreachable (a restart, a failover, a storm of terminated connections)
   * the completion is sent again, and the answer waits, until it lands or the lease this process
   * holds (`leaseEnds`) has run out.
   */
  private async complete(
    spec: ClaimSpec,
    key: string,
    token: string,
    attempt: number,
    leaseEnds: number,
    /** Key checks: the response, written by the completion itself (false: no key checks). */
    response: StoredResponse | null | false | undefined,
  ): Promise<boolean> {
    try {
      const parameters: unknown[] = [spec.scope, key, token];
      const checked = response !== false && response !== undefined;
      if (checked) parameters.push(response);
      const { leaseComplete } = checked ? this.database.checkedStatements : this.database.statements;
      if (await this.fenced(leaseComplete, parameters, spec, key, token, 'done', leaseEnds)) return true;
      await this.reportLeaseLost(spec, key, attempt);
    } catch (error) {
      // The work happened: answering 5xx would make the sender run it again once the lease
      // expires. The row stays in_progress, expires, and the reporter shows it.
      this.logger.error(completionFailed(spec.scope, key, error));
    }
    return false;
  }

  /**
   * Marks the attempt failed, so the next delivery re-claims the event at once rather than after
   * the lease. When the database does not answer, the mark goes on being sent after the failure
   * has been answered (in the background, until it lands, the lease runs out or the app stops):
   * the sender's redelivery after an outage then finds the event claimable, not held for the rest
   * of the lease.
   */
  private async fail(
    spec: ClaimSpec,
    key: string,
    token: string,
    attempt: number,
    error: unknown,
    leaseEnds: number,
  ): Promise<void> {
    const message = errorMessage(error).slice(0, DEFAULTS.maxErrorLength);
    const parameters = [spec.scope, key, token, message];
    const { leaseFail } = this.database.statements;
    let lost: boolean;
    try {
      lost = !(await this.fenced(leaseFail, parameters, spec, key, token, 'failed'));
    } catch (markError) {
      this.metrics.count('failed', spec.scope, key);
      if (!isConnectionError(markError) || performance.now() >= leaseEnds || this.stopping.signal.aborted) {
        // Not marked, yet still this worker's failure: the lease expires and the event is re-claimed.
        this.logger.error(releaseFailed(spec.scope, key, markError));
        return;
      }
      this.logger.warn(failureMarkPending(spec.scope, key, markError));
      void this.fenced(leaseFail, parameters, spec, key, token, 'failed', leaseEnds).then(
        (marked) => (marked ? undefined : this.reportLeaseLost(spec, key, attempt)),
        (lastError: unknown) => this.logger.error(releaseFailed(spec.scope, key, lastError)),
      );
      return;
    }
    // Lost: another worker holds the event now. The failure marked nothing, and what this attempt
    // did outside the database before it threw may run again under the new holder.
    if (lost) await this.reportLeaseLost(spec, key, attempt);
    else this.metrics.count('failed', spec.scope, key);
  }

  /**
   * Removes the claim of a delivery its handler refused (a 4xx): a refusal leaves no claim, as in
   * transaction mode. Fenced: a lease taken over meanwhile is left to its new holder.
   */
  private async refuse(spec: ClaimSpec, key: string, token: string, attempt: number): Promise<void> {
    this.metrics.count('failed', spec.scope, key);
    try {
      const { result, resent } = await this.database.executor.executeResending(
        this.database.statements.leaseRefuse,
        [spec.scope, key, token],
      );
      // Nothing removed by a resend: the first send removed it and its answer was lost.
      if (result.rowCount === 0 && !resent) await this.reportLeaseLost(spec, key, attempt);
    } catch (error) {
      this.logger.error(refusalNotRemoved(spec.scope, key, error));
    }
  }

  /**
   * A fenced update (completion, failure mark, renewal), sent again on a fresh connection when the
   * connection fails, so that a lost connection does not leave a finished event in progress for
   * its whole lease and call the downstream a second time once it expires. True when the row is
   * this token's and reached `status`: the update matched, or a resend matched nothing because an
   * earlier send had run and only its answer was lost. With `persistUntil` (a performance.now()
   * time), rounds of resends go on, paused, until then: fenced by the token, a late send changes
   * nothing once another worker holds the event.
   */
  private async fenced(
    statement: ClaimStatement,
    parameters: unknown[],
    spec: ClaimSpec,
    key: string,
    token: string,
    status: 'done' | 'failed' | 'in_progress',
    persistUntil?: number,
  ): Promise<boolean> {
    const { result, resent } = await this.sendPersistently(statement, parameters, persistUntil);
    if (result.rowCount === 1) return true;
    if (!resent) return false;
    const [state] = (
      await this.sendPersistently(this.database.statements.claimState, [spec.scope, key], persistUntil)
    ).result.rows;
    return state?.lease_token === token && state.status === status;
  }

  /** executeResending(), in rounds until `until` while the connection keeps failing. */
  private async sendPersistently(statement: ClaimStatement, parameters: unknown[], until?: number) {
    for (let round = 0; ; round++) {
      try {
        const { result, resent } = await this.database.executor.executeResending(statement, parameters);
        return { result, resent: resent || round > 0 };
      } catch (error) {
        const pause = Math.min(MAX_RESEND_PAUSE_MS, RESEND_PAUSE_MS * 2 ** round);
        const stopped = this.stopping.signal.aborted;
        if (until === undefined || stopped || !isConnectionError(error) || performance.now() + pause >= until)
          throw error;
        await new Promise<void>((resolve) => {
          // Unref'd: a resend never keeps a stopping process alive.
          setTimeout(resolve, pause).unref();
        });
      }
    }
  }

  /** A fenced completion or failure matched nothing: the lease was taken over meanwhile. */
  private async reportLeaseLost(spec: ClaimSpec, key: string, attempt: number) {
    this.metrics.count('lease_lost', spec.scope, key);
    // Only for the log: the lease is lost whether or not this read succeeds.
    const current = await this.database.executor
      .execute(this.database.statements.currentAttempt, [spec.scope, key])
      .then(
        (result) => result.rows[0]?.attempts as number | undefined,
        () => undefined,
      );
    this.logger.error(leaseLost(spec.scope, key, attempt, current));
  }

  private extend(spec: ClaimSpec, key: string, token: string, ms: number): Promise<boolean> {
    const { leaseExtend } = this.database.statements;
    return this.fenced(leaseExtend, [spec.scope, key, token, ms], spec, key, token, 'in_progress');
  }

  private startHeartbeat(
    spec: ClaimSpec,
    key: string,
    handle: LeaseHandle,
    leaseMs: number,
  ): ReturnType<typeof setInterval> {
    const timer = setInterval(
      () => {
        handle.extendLease().then(
          (held) => {
            if (!held) clearInterval(timer);
          },
          (error: unknown) => this.logger.warn(heartbeatFailed(spec.scope, key, error)),
        );
      },
      Math.max(1, Math.floor(leaseMs / 3)),
    );
    timer.unref();
    return timer;
  }

  /**
   * A claim-path query; infrastructure failures become IdempotencyUnavailableError, a lock wait
   * that ran out (an answer, not a failure) LockWaitExceeded.
   */
  private async query(spec: ClaimSpec, key: string, statement: ClaimStatement, parameters: unknown[]) {
    try {
      // The claim is resent with its token after a lost connection: it takes back its own lease.
      const { result } = await this.database.executor.executeResending(statement, parameters);
      return result.rows as Record<string, any>[];
    } catch (error) {
      if (errorCode(error) === LOCK_NOT_AVAILABLE) throw new LockWaitExceeded();
      throw databaseUnavailableError(
        this.logger,
        (code) => claimFailedLog(spec.scope, key, code, error),
        spec.scope,
        key,
        this.config.retryAfterSeconds,
        error,
      );
    }
  }
}
