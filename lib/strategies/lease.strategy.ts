import { randomUUID } from 'node:crypto';
import { Inject, Injectable, Logger } from '@nestjs/common';
import type { DataSource } from 'typeorm';
import type { ClaimResult } from '../core/claim-result.js';
import type { ClaimHandle, ClaimSpec, ClaimStrategy } from '../core/claim-strategy.js';
import { DEFAULTS, IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';
import {
  claimFailedLog,
  completionFailed,
  handlerDatabaseFailedLog,
  heartbeatFailed,
  leaseLost,
  releaseFailed,
} from '../idempotency.messages.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import {
  CLAIM_STATE,
  CURRENT_ATTEMPT,
  LEASE_CLAIM,
  LEASE_COMPLETE,
  LEASE_EXTEND,
  LEASE_FAIL,
} from '../postgres/claim.sql.js';
import { errorMessage, isConnectionError } from '../postgres/pg-errors.js';
import { StatementExecutor, type ClaimStatement } from '../postgres/statement-executor.js';
import { databaseUnavailableError } from './database-unavailable.js';

/**
 * Claims between the lease claim and its state read can change hands (a lease expires, a holder
 * fails); a few rounds settle it.
 */
const MAX_CLAIM_ROUNDS = 3;

/**
 * External mode (seed "fix two"): a three-state claim for work that leaves the database. A live
 * lease held elsewhere is answered in flight (never success for unfinished work); an expired
 * lease or a failed attempt is re-claimed under a new fencing token, and only the current token
 * holder can mark the event done.
 */
@Injectable()
export class LeaseStrategy implements ClaimStrategy {
  private readonly logger = new Logger('IdempotencyModule');
  private readonly statements: StatementExecutor;

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
  ) {
    this.statements = new StatementExecutor(dataSource, config.preparedStatements, this.logger);
  }

  async run<T>(
    spec: ClaimSpec,
    key: string,
    work: (handle: ClaimHandle) => Promise<T>,
  ): Promise<ClaimResult<T>> {
    const leaseMs = spec.leaseMs ?? this.config.leaseMs;
    const claim = await this.claim(spec, key, leaseMs);
    if (claim.kind !== 'claimed') return claim;

    const { token, attempt } = claim;
    this.metrics.count(attempt === 1 ? 'claimed' : 'reclaimed', spec.scope, key);
    const extendLease = (ms = leaseMs) => this.extend(spec, key, token, ms);
    const heartbeat = spec.heartbeat ? this.startHeartbeat(spec, key, extendLease, leaseMs) : undefined;
    let value: T;
    try {
      value = await work({ manager: this.dataSource.manager, leaseToken: token, attempt, extendLease });
    } catch (error) {
      clearInterval(heartbeat);
      await this.fail(spec, key, token, attempt, error);
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
    await this.complete(spec, key, token, attempt);
    return { kind: 'processed', value };
  }

  private async claim(
    spec: ClaimSpec,
    key: string,
    leaseMs: number,
  ): Promise<{ kind: 'claimed'; token: string; attempt: number } | ClaimResult<never>> {
    for (let round = 1; ; round++) {
      const token = randomUUID();
      const claimed = await this.query(spec, key, LEASE_CLAIM, [
        spec.scope,
        key,
        spec.source,
        token,
        leaseMs,
      ]);
      if (claimed.length === 1) return { kind: 'claimed', token, attempt: Number(claimed[0].attempts) };

      const [state] = await this.query(spec, key, CLAIM_STATE, [spec.scope, key]);
      if (state?.status === 'done') {
        this.metrics.count('replayed', spec.scope, key);
        return { kind: 'replayed' };
      }
      // Gone (retention), failed or expired since the claim: claim again. Still live: in flight.
      if ((state?.status === 'in_progress' && state.live) || round >= MAX_CLAIM_ROUNDS) {
        this.metrics.count('in_flight', spec.scope, key);
        const secondsLeft = state?.live ? Number(state.seconds_left) : 1;
        return { kind: 'in_flight', retryAfterSeconds: Math.min(secondsLeft, this.config.retryAfterSeconds) };
      }
    }
  }

  private async complete(spec: ClaimSpec, key: string, token: string, attempt: number) {
    try {
      if ((await this.statements.update(LEASE_COMPLETE, [spec.scope, key, token])) === 1) return;
      await this.reportLeaseLost(spec, key, attempt);
    } catch (error) {
      // The work happened: answering 5xx would make the sender run it again once the lease
      // expires. The row stays in_progress, expires, and the reporter shows it.
      this.logger.error(completionFailed(spec.scope, key, error));
    }
  }

  private async fail(spec: ClaimSpec, key: string, token: string, attempt: number, error: unknown) {
    const message = errorMessage(error).slice(0, DEFAULTS.maxErrorLength);
    let lost: boolean;
    try {
      lost = !(await this.markFailed(spec, key, token, attempt, message));
    } catch (releaseError) {
      // Not marked, yet still this worker's failure: the lease expires and the event is re-claimed.
      lost = false;
      this.logger.error(releaseFailed(spec.scope, key, releaseError));
    }
    // Lost: another worker holds the event now. The failure marked nothing, and what this attempt
    // did outside the database before it threw may run again under the new holder.
    if (lost) await this.reportLeaseLost(spec, key, attempt);
    else this.metrics.count('failed', spec.scope, key);
  }

  /**
   * The fenced failure mark; true when this attempt's claim is marked failed. A handler's lost
   * connection often takes the first send with it: when a backend is terminated (57P01) the
   * statement's error arrives before the socket closes, so pg-pool takes the connection back as
   * healthy and hands it out first (its idle list is last in, first out), to this very mark. One
   * more send goes out on a live connection; without it the event would wait out its whole lease
   * although the sender was told to retry after `retryAfterSeconds`.
   */
  private async markFailed(
    spec: ClaimSpec,
    key: string,
    token: string,
    attempt: number,
    message: string,
  ): Promise<boolean> {
    const parameters = [spec.scope, key, token, message];
    try {
      return (await this.statements.update(LEASE_FAIL, parameters)) === 1;
    } catch (error) {
      if (!isConnectionError(error)) throw error;
    }
    if ((await this.statements.update(LEASE_FAIL, parameters)) === 1) return true;
    // Nothing matched: taken over, or the first send did run and only its answer was lost.
    const [state] = (await this.statements.execute(CLAIM_STATE, [spec.scope, key])).rows;
    return state?.status === 'failed' && Number(state.attempts) === attempt;
  }

  /** A fenced completion or failure matched nothing: the lease was taken over meanwhile. */
  private async reportLeaseLost(spec: ClaimSpec, key: string, attempt: number) {
    this.metrics.count('lease_lost', spec.scope, key);
    // Only for the log: the lease is lost whether or not this read succeeds.
    const current = await this.statements.execute(CURRENT_ATTEMPT, [spec.scope, key]).then(
      (result) => result.rows[0]?.attempts as number | undefined,
      () => undefined,
    );
    this.logger.error(leaseLost(spec.scope, key, attempt, current));
  }

  private async extend(spec: ClaimSpec, key: string, token: string, ms: number): Promise<boolean> {
    return (await this.statements.update(LEASE_EXTEND, [spec.scope, key, token, ms])) === 1;
  }

  private startHeartbeat(
    spec: ClaimSpec,
    key: string,
    extendLease: () => Promise<boolean>,
    leaseMs: number,
  ): ReturnType<typeof setInterval> {
    const timer = setInterval(
      () => {
        extendLease().then(
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

  /** A claim-path query; infrastructure failures become IdempotencyUnavailableError. */
  private async query(spec: ClaimSpec, key: string, statement: ClaimStatement, parameters: unknown[]) {
    try {
      return (await this.statements.execute(statement, parameters)).rows as Record<string, any>[];
    } catch (error) {
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
