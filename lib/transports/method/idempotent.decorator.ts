import { Inject } from '@nestjs/common';
import { resolveClaimSpec } from '../../core/claim-options.js';
import type { ClaimSpec } from '../../core/claim-strategy.js';
import { extractIdempotencyKey } from '../../core/idempotency-key.js';
import { ClaimRunner } from '../../core/claim-runner.js';
import { IDEMPOTENCY_CONFIG, IDEMPOTENT_METHOD_METADATA } from '../../idempotency.constants.js';
import { badClaimOption, claimOptionType, missingKeyFunction } from '../../idempotency.messages.js';
import type { IdempotencyConfig, IdempotentOptions } from '../../interfaces/index.js';

const methodNotBound = (scope: string) =>
  `@Idempotent method ${scope} was called on an instance Nest did not create (new, useValue or useFactory): it has no IdempotencyService to claim with, so it did not run`;

const notAMethod = (where: string) => `@Idempotent on ${where}: not a method`;

/** What `@Idempotent` stores on the method: the claim spec, resolved once, and the key extractor. */
export interface IdempotentMethodMetadata extends ClaimSpec {
  key: (...args: any[]) => unknown;
}

/**
 * Where Nest puts the app's ClaimRunner and config on each instance of a class with an
 * `@Idempotent` method: injected as properties, so every instance Nest creates (singleton,
 * request-scoped or transient) reaches its own app's service, even with several apps in one
 * process.
 */
const SERVICE = Symbol('idempotency:service');
const CONFIG = Symbol('idempotency:config');

interface Bound {
  [SERVICE]?: ClaimRunner;
  [CONFIG]?: IdempotencyConfig;
}

/** `@Idempotent`'s options beside the claim's. */
const METHOD_OPTIONS = ['key', 'onReplay'] as const satisfies readonly (keyof IdempotentOptions)[];

/**
 * Makes a provider method idempotent where no interceptor runs: a `@nestjs/bullmq`
 * `WorkerHost.process(job)`, a cron job, any service method. The method runs once per event
 * under a claim (transaction mode by default: write through `IdempotencyContext.manager`);
 * a duplicate in flight rejects with EventInFlightError, so a queue retries it with its backoff.
 * A replayed event does not run the method: the call resolves with what `onReplay` returns for
 * the same arguments, or `undefined` without it (give `onReplay` to tell a replay from a result).
 *
 * ```ts
 * @Processor('payments')
 * export class PaymentsProcessor extends WorkerHost {
 *   constructor(private readonly context: IdempotencyContext) { super(); }
 *
 *   @Idempotent({ key: (job: Job<PaymentEvent>) => job.data.eventId, onReplay: () => 'replayed' })
 *   async process(job: Job<PaymentEvent>): Promise<'recorded' | 'replayed'> {
 *     await this.context.manager.insert(Payment, { eventId: job.data.eventId });
 *     return 'recorded';
 *   }
 * }
 * ```
 *
 * The method must return a Promise (it is made to wait for its claim; a synchronous method does
 * not compile). It is replaced by a wrapper that keeps its name and every metadata key set on it,
 * so decorators applied before or after (`@Cron`, `@OnEvent`, your own) still see it.
 */
export function Idempotent<Args extends any[] = any[]>(
  options: IdempotentOptions<Args>,
): (
  target: object,
  propertyKey: string | symbol,
  descriptor: TypedPropertyDescriptor<(...args: Args) => Promise<any>>,
) => void {
  if (typeof options?.key !== 'function') throw new TypeError(missingKeyFunction('@Idempotent'));
  const { key, onReplay } = options;
  if (onReplay !== undefined && typeof onReplay !== 'function') {
    throw new TypeError(badClaimOption('@Idempotent', claimOptionType('onReplay', 'a function')));
  }
  return (target, propertyKey, descriptor) => {
    const original = descriptor.value as (...args: Args) => unknown;
    const scope = `${target.constructor.name}.${String(propertyKey)}`;
    if (typeof original !== 'function') throw new TypeError(notAMethod(scope));
    const spec = resolveClaimSpec('@Idempotent', options, scope, METHOD_OPTIONS);
    const metadata: IdempotentMethodMetadata = { ...spec, key };

    const wrapper = function (this: Bound, ...args: Args): Promise<unknown> {
      const service = this?.[SERVICE];
      const config = this?.[CONFIG];
      if (!service || !config) return Promise.reject(new Error(methodNotBound(scope)));
      let claimKey: string;
      try {
        claimKey = extractIdempotencyKey(spec.scope, key, args, config.maxKeyLength);
      } catch (error) {
        return Promise.reject(error);
      }
      return service
        .run(spec, claimKey, () => original.apply(this, args))
        .then((result) => {
          if (result.status === 'processed') return result.value;
          return onReplay ? onReplay.apply(this, args) : undefined;
        });
    };
    Object.defineProperty(wrapper, 'name', { value: original.name });
    copyMethodMetadata(original, wrapper);
    Reflect.defineMetadata(IDEMPOTENT_METHOD_METADATA, metadata, wrapper);
    descriptor.value = wrapper as (...args: Args) => Promise<any>;

    if (!Object.prototype.hasOwnProperty.call(target, SERVICE)) {
      Inject(ClaimRunner)(target, SERVICE);
      Inject(IDEMPOTENCY_CONFIG)(target, CONFIG);
      // Marks the prototype, so a second @Idempotent method of the class injects nothing more.
      Object.defineProperty(target, SERVICE, { value: undefined, writable: true, configurable: true });
      Object.defineProperty(target, CONFIG, { value: undefined, writable: true, configurable: true });
    }
  };
}

/** nestjs-cls's `copyMethodMetadata`: every metadata key of the original, onto its wrapper. */
function copyMethodMetadata(from: object, to: object): void {
  for (const metadataKey of Reflect.getMetadataKeys(from)) {
    Reflect.defineMetadata(metadataKey, Reflect.getMetadata(metadataKey, from), to);
  }
}
