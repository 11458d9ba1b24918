import { Inject, Injectable, type OnModuleInit } from '@nestjs/common';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import { EventInFlightError } from '../idempotency.errors.js';
import { duplicateInFlight, runNeedsScope } from '../idempotency.messages.js';
import type { IdempotencyConfig, IdempotentRunOptions, IdempotentRunResult } from '../interfaces/index.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { assertTypeOrmInternals, listenForEarlyErrors } from '../postgres/typeorm-internals.js';
import { CLAIM_STRATEGY_REGISTRY } from '../strategies/claim-strategies.js';
import type { ClaimResult } from './claim-result.js';
import { resolveClaimSpec } from './claim-options.js';
import type { ClaimSpec, ClaimStrategy } from './claim-strategy.js';
import { runInIdempotencyContext, type IdempotentDelivery } from './idempotency-context.js';
import { checkIdempotencyKey } from './idempotency-key.js';

/**
 * The one way every transport makes a delivery idempotent: check the key, claim it with the
 * handler's strategy, run the work inside `IdempotencyContext`, and record the outcome.
 *
 * ```ts
 * const result = await idempotency.run({ scope: 'billing.invoice-paid', key: event.id }, async ({ manager }) => {
 *   await manager.update(Invoice, { id: event.invoiceId, status: 'pending' }, { status: 'paid' });
 * });
 * // { status: 'processed', value } or { status: 'replayed' }
 * ```
 */
@Injectable()
export class IdempotencyService implements OnModuleInit {
  constructor(
    @Inject(CLAIM_STRATEGY_REGISTRY) private readonly strategies: ReadonlyMap<string, ClaimStrategy>,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly database: ClaimDatabase,
  ) {}

  /**
   * Fails the boot, rather than every delivery, when TypeORM moved what the claim path relies on
   * or the claims table is missing or not the migration's; keeps a session terminated as it
   * starts from ending the process (listenForEarlyErrors).
   */
  async onModuleInit(): Promise<void> {
    assertTypeOrmInternals(this.database.dataSource);
    listenForEarlyErrors(this.database.dataSource);
    await this.database.checkTable();
  }

  /**
   * Runs `fn` once per (scope, key). Resolves `processed` with its value, or `replayed` when the
   * event is already done (`fn` does not run). Rejects with InvalidIdempotencyKeyError (nothing
   * written), EventInFlightError (another delivery holds the event: retry after
   * `retryAfterSeconds`), IdempotencyUnavailableError (the database failed: retry),
   * TransactionAbortedError, or `fn`'s own error (the claim is rolled back or marked failed, so a
   * retry runs `fn` again). Options are checked on every call: a mistake rejects with a TypeError.
   */
  async run<T>(
    options: IdempotentRunOptions,
    fn: (delivery: IdempotentDelivery) => T | Promise<T>,
  ): Promise<IdempotentRunResult<T>> {
    if (typeof options?.scope !== 'string') {
      throw new TypeError(runNeedsScope());
    }
    const spec = resolveClaimSpec('IdempotencyService.run', options, options.scope);
    return this.runChecked(spec, checkIdempotencyKey(spec.scope, options.key, this.config.maxKeyLength), fn);
  }

  /** run() for a spec and key already checked (the method decorator resolves its spec once). */
  async runChecked<T>(
    spec: ClaimSpec,
    key: string,
    fn: (delivery: IdempotentDelivery) => T | Promise<T>,
  ): Promise<IdempotentRunResult<T>> {
    const result = await this.execute(spec, key, async (delivery) => fn(delivery));
    switch (result.kind) {
      case 'processed':
        return { status: 'processed', value: result.value };
      case 'replayed':
        return { status: 'replayed' };
      case 'in_flight':
        throw new EventInFlightError(duplicateInFlight(key), spec.scope, key, result.retryAfterSeconds);
    }
  }

  /**
   * The claim itself, for transports that answer each result their own way (the interceptor):
   * no error is made for an in-flight duplicate, which a storm answers many times a second.
   */
  execute<T>(
    spec: ClaimSpec,
    key: string,
    work: (delivery: IdempotentDelivery) => Promise<T>,
  ): Promise<ClaimResult<T>> {
    const strategy = this.strategies.get(spec.mode)!;
    return strategy.run(spec, key, (handle) => {
      const delivery: IdempotentDelivery = {
        key,
        scope: spec.scope,
        source: spec.source,
        mode: spec.mode,
        manager: handle.manager,
        executor: handle.executor,
        leaseToken: handle.leaseToken,
        attempt: handle.attempt,
        extendLease: handle.extendLease,
      };
      return runInIdempotencyContext(delivery, () => work(delivery));
    });
  }
}
