import type { EnqueueOptions } from '../interfaces/index.js';
import type { IdempotentDelivery } from './idempotency-context.js';

/**
 * What `IdempotencyContext.enqueue()` hands a job to: the queue transport (transports/queue/),
 * when the module has a `handoff` option. Core knows only this shape, not pg-boss.
 */
export interface JobEnqueuer {
  /** Writes a job for `delivery`'s event through its claim transaction; resolves with the job's id. */
  enqueue(
    delivery: IdempotentDelivery,
    queue: string,
    data: unknown,
    options?: EnqueueOptions,
  ): Promise<string>;
}

/** DI token of the module's JobEnqueuer. */
export const JOB_ENQUEUER = Symbol('JOB_ENQUEUER');
