import { Inject, Injectable, Logger } from '@nestjs/common';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import { claimForgotten, claimReleased } from '../idempotency.messages.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type {
  ClaimListOptions,
  ClaimRecord,
  ClaimRefusal,
  ForgetClaimResult,
  IdempotencyConfig,
  ReleaseClaimResult,
} from '../interfaces/index.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { pgPoolOf } from '../postgres/typeorm-internals.js';
import { ClaimsOperator } from './claims.operator.js';

const claimActionRefused = (action: string, message: string) => `${action} refused: ${message}`;

/**
 * The claims table for operators, from inside the app (an admin endpoint, a script run with the
 * app's module): list claims by state, scope and age, show one, release a stuck lease, forget a
 * done event so that it is processed again. The `claims` CLI does the same from a shell with the
 * same statements. Each release and forget is logged as a warning and counted (`released`,
 * `forgotten`); each refusal is logged. Refusals are answered, not thrown: only a database failure
 * throws.
 */
@Injectable()
export class IdempotencyClaims {
  private readonly logger = new Logger('IdempotencyClaims');
  private readonly operator: ClaimsOperator;

  constructor(
    database: ClaimDatabase,
    @Inject(IDEMPOTENCY_CONFIG) config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
  ) {
    this.operator = new ClaimsOperator((text, values) => pgPoolOf(database.dataSource).query(text, values), {
      table: database.table,
      maxAttempts: config.maxAttempts,
      // The bound a duplicate waits on a delivery's transaction is the operator's bound too.
      lockWaitMs: config.concurrentDuplicateWaitMs,
    });
  }

  /**
   * Claims, most recently claimed first (poison: most attempts first), at most `limit` (100).
   * `status`: `in_progress` (a live lease), `expired` (an in-progress claim whose lease has run
   * out), `failed`, `poison` (not done after `maxAttempts` attempts or more, in any state but
   * done), `done`; every state when absent. `olderThanMs`: last claimed at least that long ago.
   * A bad option rejects with a TypeError naming it.
   */
  list(options: ClaimListOptions = {}): Promise<ClaimRecord[]> {
    return this.operator.list(options);
  }

  /** The claim of `key` under `scope`, or undefined. */
  show(scope: string, key: string): Promise<ClaimRecord | undefined> {
    return this.operator.show(scope, key);
  }

  /**
   * Takes an in-progress claim (a live lease, or an expired one) away from its holder, so the
   * event's next delivery claims it at once (attempt + 1) instead of waiting out the lease. The
   * claim becomes `failed` with no token and `lastError` saying an operator released it; the
   * holder, if it is still running, finds its lease lost when it finishes (`lease_lost`), and its
   * side effect may then run twice: release a live lease only when its worker is stuck or dead.
   * Refused (`released: false`), changing nothing: `done` (no lease; forget it instead), `failed`
   * (no lease: the next delivery claims it already), `not_found`, `locked`.
   */
  async release(scope: string, key: string): Promise<ReleaseClaimResult> {
    const result = await this.operator.release(scope, key);
    if (!result.released) return this.refused('release', result);
    this.metrics.count('released', scope, key);
    this.logger.warn(claimReleased(scope, key, result.claim.attempts, result.leaseWasLive));
    return result;
  }

  /**
   * Deletes a claim that no live lease holds (done, failed, or expired), so the event's next
   * delivery is processed as a first delivery (attempt 1): the handler runs, and its effect
   * happens, again. Needs `{ force: true }`. Refused (`forgotten: false`), changing nothing:
   * `force_required`, `live_lease` (even with force: release it first), `not_found`, `locked`.
   */
  async forget(scope: string, key: string, options: { force?: boolean } = {}): Promise<ForgetClaimResult> {
    const result = await this.operator.forget(scope, key, options);
    if (!result.forgotten) return this.refused('forget', result);
    this.metrics.count('forgotten', scope, key);
    this.logger.warn(claimForgotten(scope, key, result.claim.status, result.claim.attempts));
    return result;
  }

  private refused<T extends { refusal: ClaimRefusal }>(action: string, result: T): T {
    this.logger.log(claimActionRefused(action, result.refusal.message));
    return result;
  }
}
