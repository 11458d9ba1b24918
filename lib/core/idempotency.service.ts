import { Inject, Injectable } from '@nestjs/common';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import type { IdempotencyConfig, IdempotentRunOptions, IdempotentRunResult } from '../interfaces/index.js';
import type { IdempotentDelivery } from './claim-delivery.js';
import { resolveClaimSpec } from './claim-options.js';
import { ClaimRunner } from './claim-runner.js';
import { checkIdempotencyKey } from './idempotency-key.js';

const runNeedsScope = () =>
  'IdempotencyService.run needs options with a scope, e.g. { scope: "billing", key }';

/**
 * Makes any piece of work idempotent, where no decorator fits: the same claim, checks and
 * answers as every transport's.
 *
 * ```ts
 * const result = await idempotency.run({ scope: 'billing.invoice-paid', key: event.id }, async ({ manager }) => {
 *   await manager.update(Invoice, { id: event.invoiceId, status: 'pending' }, { status: 'paid' });
 * });
 * // { status: 'processed', value } or { status: 'replayed' }
 * ```
 */
@Injectable()
export class IdempotencyService {
  constructor(
    private readonly runner: ClaimRunner,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
  ) {}

  /**
   * Runs `fn` once per (scope, key). Resolves `processed` with its value, or `replayed` when the
   * event is already done (`fn` does not run). Rejects with InvalidIdempotencyKeyError (nothing
   * written), EventInFlightError (another delivery holds the event: retry after
   * `retryAfterSeconds`), IdempotencyUnavailableError (the database failed: retry),
   * TransactionAbortedError, PropagationError, or `fn`'s own error (the claim is rolled back or
   * marked failed, so a retry runs `fn` again). Options are checked on every call: a mistake
   * rejects with a TypeError naming it.
   */
  async run<T>(
    options: IdempotentRunOptions,
    fn: (delivery: IdempotentDelivery) => T | Promise<T>,
  ): Promise<IdempotentRunResult<T>> {
    if (typeof options?.scope !== 'string') {
      throw new TypeError(runNeedsScope());
    }
    const spec = resolveClaimSpec('IdempotencyService.run', options, options.scope, ['key']);
    return this.runner.run(spec, checkIdempotencyKey(spec.scope, options.key, this.config.maxKeyLength), fn);
  }
}
