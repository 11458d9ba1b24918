import { resolveClaimSpec } from '../../core/claim-options.js';
import type { ClaimSpec } from '../../core/claim-strategy.js';
import { badClaimOption, claimOptionType } from '../../idempotency.messages.js';
import type { HandlerDecorator, HandoffJob, IdempotentWorkerOptions } from '../../interfaces/index.js';
import { isQueueName } from './handoff-options.js';

const notAMethod = (where: string) => `@IdempotentWorker on ${where}: not a method`;

const workerBadQueue = (value: unknown) =>
  `@IdempotentWorker needs a queue name (1 to 100 letters, digits, and _ . - /), got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

/** Metadata key under which `@IdempotentWorker` stores its resolved options on the method. */
export const IDEMPOTENT_WORKER_METADATA = 'idempotency:worker';

/** `@IdempotentWorker`'s own option beside the claim's (taken out before the claim's are checked). */
const WORKER_OPTIONS = ['concurrency'] as const;

/** The most jobs one worker runs at once in a process: each holds a pool connection. */
const MAX_CONCURRENCY = 1_000;

/** What `@IdempotentWorker` stores on the method, resolved once. */
export interface IdempotentWorkerMetadata {
  queue: string;
  spec: ClaimSpec;
  /** No `source` option: each claim takes the source of the delivery that enqueued the job. */
  sourceFromEvent: boolean;
  concurrency: number;
}

/**
 * Runs a provider method for each job of `queue` that `IdempotencyContext.enqueue()` wrote, under
 * a claim keyed by the job itself (`HandoffJob.key`: enqueue()'s `key`, else the job's id), so
 * that every job runs, and a job pg-boss hands out twice (expired, retried, its worker killed) has
 * one effect:
 * - transaction mode (default): the method's writes through `IdempotencyContext.manager`, its
 *   claim and the job's completion commit in one transaction;
 * - external mode (`external: true`): a fenced lease; send `IdempotencyContext.downstreamKey`
 *   (the job's key, header-safe) downstream as the Idempotency-Key, never `job.event.key`, which
 *   every job of one event shares.
 *
 * A method that throws fails the job: pg-boss retries it with its queue's backoff, and moves it to
 * the dead-letter queue once retries run out. The module fetches jobs on the DataSource's pool,
 * `concurrency` at a time per process; start-up fails if the module has no `handoff` option.
 *
 * ```ts
 * @Injectable()
 * export class FulfilmentWorker {
 *   constructor(private readonly context: IdempotencyContext) {}
 *
 *   @IdempotentWorker('fulfilment', { external: true, leaseMs: 60_000 })
 *   async fulfil(job: HandoffJob<{ sessionId: string }>) {
 *     await this.api.post(job.data, { idempotencyKey: this.context.downstreamKey });
 *   }
 * }
 * ```
 *
 * Typed by the method: `Data` is the job data its first parameter takes (`{ sessionId: string }`
 * above), or the one given (`@IdempotentWorker<FulfilmentData>('fulfilment')`), which the first
 * parameter, a `HandoffJob<FulfilmentData>`, must then accept. `any` without either.
 */
export function IdempotentWorker<Data = any>(
  queue: string,
  options: IdempotentWorkerOptions = {},
): HandlerDecorator<HandoffJob<Data>> {
  if (!isQueueName(queue)) throw new TypeError(workerBadQueue(queue));
  const { concurrency = 1, ...claim } = options ?? {};
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > MAX_CONCURRENCY) {
    throw new TypeError(
      badClaimOption(
        '@IdempotentWorker',
        claimOptionType('concurrency', `a whole number from 1 to ${MAX_CONCURRENCY}`),
      ),
    );
  }
  // Checked now, so a mistake fails at import; the scope is known only once the method is.
  resolveClaimSpec('@IdempotentWorker', claim, 'IdempotentWorker', WORKER_OPTIONS);
  return (target, propertyKey, descriptor) => {
    const scope = `${target.constructor.name}.${String(propertyKey)}`;
    if (typeof descriptor?.value !== 'function') throw new TypeError(notAMethod(scope));
    const spec = resolveClaimSpec('@IdempotentWorker', claim, scope, WORKER_OPTIONS);
    const metadata: IdempotentWorkerMetadata = {
      queue,
      spec,
      sourceFromEvent: claim.source === undefined,
      concurrency,
    };
    Reflect.defineMetadata(IDEMPOTENT_WORKER_METADATA, metadata, descriptor.value);
  };
}
