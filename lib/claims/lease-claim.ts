import { randomUUID } from 'node:crypto';
import { Inject, Injectable, Logger } from '@nestjs/common';
import type { DataSource, EntityManager } from 'typeorm';
import { DEFAULTS, IDEMPOTENCY_CONFIG, IDEMPOTENCY_DATA_SOURCE } from '../idempotency.constants.js';
import { completionFailed, leaseLost, releaseFailed, statementForgotten } from '../idempotency.messages.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig, IdempotentWebhookMetadata } from '../interfaces/index.js';
import { claimUnavailable, errorCode, UNKNOWN_PREPARED_STATEMENT, type ClaimResult } from './claim-result.js';
import { claimQuery, pgPoolOf, type ClaimStatement } from './claim-statement.js';
import {
  CLAIM_STATE,
  CURRENT_ATTEMPT,
  LEASE_CLAIM,
  LEASE_COMPLETE,
  LEASE_EXTEND,
  LEASE_FAIL,
} from './claim.sql.js';

/** The lease a handler holds while it runs. */
export interface Lease {
  /** No transaction spans external work: writes go through the DataSource's manager. */
  manager: EntityManager;
  token: string;
  attempt: number;
  /** Token-checked renewal; false once another worker has taken the lease over. */
  extend(ms?: number): Promise<boolean>;
}

/**
 * Claims between the lease claim and its state read can change hands (a lease expires, a holder
 * fails); a few rounds settle it.
 */
const MAX_CLAIM_ROUNDS = 3;

/** Sends of one statement whose connections had forgotten it (see execute()). */
const MAX_STATEMENT_SENDS = 3;
/** The forgotten-statement warning repeats at most this often. */
const FORGOTTEN_WARNING_EVERY_MS = 60_000;

/**
 * External mode (seed "fix two"): a three-state claim for work that leaves the database. A live
 * lease held elsewhere is answered in-flight (never 200 for unfinished work); an expired lease or
 * a failed attempt is re-claimed under a new fencing token, and only the current token holder can
 * mark the event done.
 */
@Injectable()
export class LeaseClaim {
  private readonly logger = new Logger('IdempotencyModule');
  private lastForgottenWarning = -Infinity;

  constructor(
    @Inject(IDEMPOTENCY_DATA_SOURCE) private readonly dataSource: DataSource,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
  ) {}

  async run<T>(
    meta: IdempotentWebhookMetadata,
    key: string,
    handler: (lease: Lease) => Promise<T>,
  ): Promise<ClaimResult<T>> {
    const leaseMs = meta.leaseMs ?? this.config.leaseMs;
    const claim = await this.claim(meta, key, leaseMs);
    if (claim.kind !== 'claimed') return claim;

    const { token, attempt } = claim;
    this.metrics.count(attempt === 1 ? 'claimed' : 'reclaimed', meta.scope, key);
    const lease: Lease = {
      manager: this.dataSource.manager,
      token,
      attempt,
      extend: (ms = leaseMs) => this.extend(meta, key, token, ms),
    };
    const heartbeat = meta.heartbeat ? this.startHeartbeat(meta, key, lease, leaseMs) : undefined;
    let value: T;
    try {
      value = await handler(lease);
    } catch (error) {
      clearInterval(heartbeat);
      await this.fail(meta, key, token, attempt, error);
      throw error;
    }
    clearInterval(heartbeat);
    await this.complete(meta, key, token, attempt);
    return { kind: 'processed', value };
  }

  private async claim(
    meta: IdempotentWebhookMetadata,
    key: string,
    leaseMs: number,
  ): Promise<{ kind: 'claimed'; token: string; attempt: number } | ClaimResult<never>> {
    for (let round = 1; ; round++) {
      const token = randomUUID();
      const claimed = await this.query(meta, key, LEASE_CLAIM, [
        meta.scope,
        key,
        meta.source,
        token,
        leaseMs,
      ]);
      if (claimed.length === 1) return { kind: 'claimed', token, attempt: Number(claimed[0].attempts) };

      const [state] = await this.query(meta, key, CLAIM_STATE, [meta.scope, key]);
      if (state?.status === 'done') {
        this.metrics.count('replayed', meta.scope, key);
        return { kind: 'replayed' };
      }
      // Gone (retention), failed or expired since the claim: claim again. Still live: in flight.
      if ((state?.status === 'in_progress' && state.live) || round >= MAX_CLAIM_ROUNDS) {
        this.metrics.count('in_flight', meta.scope, key);
        const secondsLeft = state?.live ? Number(state.seconds_left) : 1;
        return { kind: 'in_flight', retryAfterSeconds: Math.min(secondsLeft, this.config.retryAfterSeconds) };
      }
    }
  }

  private async complete(meta: IdempotentWebhookMetadata, key: string, token: string, attempt: number) {
    try {
      if ((await this.update(LEASE_COMPLETE, [meta.scope, key, token])) === 1) return;
      await this.reportLeaseLost(meta, key, attempt);
    } catch (error) {
      // The work happened: answering 5xx would make the sender run it again once the lease
      // expires. The row stays in_progress, expires, and the reporter shows it.
      this.logger.error(completionFailed(meta.scope, key, error));
    }
  }

  private async fail(
    meta: IdempotentWebhookMetadata,
    key: string,
    token: string,
    attempt: number,
    error: unknown,
  ) {
    const message = (error instanceof Error ? error.message : String(error)).slice(
      0,
      DEFAULTS.maxErrorLength,
    );
    let lost: boolean;
    try {
      lost = (await this.update(LEASE_FAIL, [meta.scope, key, token, message])) === 0;
    } catch (releaseError) {
      // Not marked, yet still this worker's failure: the lease expires and the event is re-claimed.
      lost = false;
      this.logger.error(releaseFailed(meta.scope, key, releaseError));
    }
    // Lost: another worker holds the event now. The failure marked nothing, and what this attempt
    // did outside the database before it threw may run again under the new holder.
    if (lost) await this.reportLeaseLost(meta, key, attempt);
    else this.metrics.count('failed', meta.scope, key);
  }

  /** A fenced completion or failure matched nothing: the lease was taken over meanwhile. */
  private async reportLeaseLost(meta: IdempotentWebhookMetadata, key: string, attempt: number) {
    this.metrics.count('lease_lost', meta.scope, key);
    // Only for the log: the lease is lost whether or not this read succeeds.
    const current = await this.execute(CURRENT_ATTEMPT, [meta.scope, key]).then(
      (result) => result.rows[0]?.attempts as number | undefined,
      () => undefined,
    );
    this.logger.error(leaseLost(meta.scope, key, attempt, current));
  }

  private async extend(meta: IdempotentWebhookMetadata, key: string, token: string, ms: number) {
    return (await this.update(LEASE_EXTEND, [meta.scope, key, token, ms])) === 1;
  }

  private startHeartbeat(meta: IdempotentWebhookMetadata, key: string, lease: Lease, leaseMs: number) {
    const timer = setInterval(
      () => {
        lease.extend().then(
          (held) => {
            if (!held) clearInterval(timer);
          },
          (error: unknown) =>
            this.logger.warn(`Heartbeat of ${meta.scope} key ${key} failed: ${String(error)}`),
        );
      },
      Math.max(1, Math.floor(leaseMs / 3)),
    );
    timer.unref();
    return timer;
  }

  /** Rows affected by a fenced UPDATE. */
  private async update(statement: ClaimStatement, parameters: unknown[]): Promise<number> {
    return (await this.execute(statement, parameters)).rowCount ?? 0;
  }

  /** A claim-path query; infrastructure failures become 503s. */
  private async query(
    meta: IdempotentWebhookMetadata,
    key: string,
    statement: ClaimStatement,
    parameters: unknown[],
  ) {
    try {
      return (await this.execute(statement, parameters)).rows as Record<string, any>[];
    } catch (error) {
      throw claimUnavailable(this.logger, meta.scope, key, error);
    }
  }

  /**
   * One autocommitted statement on the DataSource's pg pool, as the hand-written lease would send
   * it: no QueryRunner, and TypeORM's query() cannot send a prepared statement. pg remembers what
   * it prepared on each connection; when someone has run DEALLOCATE ALL or DISCARD ALL on one, the
   * statement fails there without running, pg-pool drops that connection, and it is sent again on
   * another, where pg prepares it anew. Each such miss costs a new connection, so it is logged:
   * many of them mean a pooler in transaction mode.
   */
  private async execute(statement: ClaimStatement, parameters: unknown[]) {
    const query = claimQuery(statement, parameters, this.config.preparedStatements);
    for (let send = 1; ; send++) {
      try {
        return await pgPoolOf(this.dataSource).query(query);
      } catch (error) {
        if (send >= MAX_STATEMENT_SENDS || errorCode(error) !== UNKNOWN_PREPARED_STATEMENT) throw error;
        const now = Date.now();
        if (now - this.lastForgottenWarning >= FORGOTTEN_WARNING_EVERY_MS) {
          this.lastForgottenWarning = now;
          this.logger.warn(statementForgotten(statement.name));
        }
      }
    }
  }
}
