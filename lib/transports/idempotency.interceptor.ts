import {
  Inject,
  Injectable,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { lastValueFrom, Observable } from 'rxjs';
import { extractIdempotencyKey } from '../core/idempotency-key.js';
import { ClaimRunner } from '../core/claim-runner.js';
import { IDEMPOTENCY_CONFIG, IDEMPOTENT_WEBHOOK_METADATA } from '../idempotency.constants.js';
import { EventInFlightError } from '../idempotency.errors.js';
import { duplicateInFlight } from '../idempotency.messages.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import { ACKNOWLEDGE, type DeliveryTransport } from './delivery-transport.js';
import { DELIVERY_TRANSPORT_REGISTRY } from './delivery-transports.js';
import type { IdempotentWebhookMetadata } from './idempotent-webhook.decorator.js';

const unsupportedContext = (scope: string, type: string) =>
  `@IdempotentWebhook on ${scope} cannot protect a '${type}' execution context; the handler was not run`;

/**
 * Applied by `@IdempotentWebhook`: extracts and checks the key, runs the handler through
 * IdempotencyService in the delivery's context, and has the context's transport (HTTP, RPC)
 * answer the outcome. A context no transport serves is refused, never passed through: the
 * explorer already fails the boot for those, and this is the last line.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  constructor(
    private readonly reflector: Reflector,
    private readonly runner: ClaimRunner,
    @Inject(DELIVERY_TRANSPORT_REGISTRY) private readonly transports: ReadonlyMap<string, DeliveryTransport>,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const meta = this.reflector.get<IdempotentWebhookMetadata | undefined>(
      IDEMPOTENT_WEBHOOK_METADATA,
      context.getHandler(),
    );
    if (!meta) return next.handle(); // applied by hand to a route without the decorator
    const transport = this.transportFor(context);
    if (!transport) throw new Error(unsupportedContext(meta.scope, context.getType()));
    // A plain Observable over the claim's promise: rxjs' defer() and from() would add promises of
    // their own to every delivery, and each pays AsyncLocalStorage's hooks.
    return new Observable((subscriber) => {
      let key: string;
      try {
        key = extractIdempotencyKey(
          meta.scope,
          meta.key,
          transport.keyArguments(context),
          this.config.maxKeyLength,
        );
      } catch (error) {
        const failure = transport.failure(error, context);
        if (failure === ACKNOWLEDGE) subscriber.complete();
        else subscriber.error(failure);
        return;
      }
      // next.handle() is cold: subscribing inside the delivery's context makes it visible to the
      // handler and to every service it awaits.
      this.runner
        // The context is the delivery's origin, read for its span only when tracing is on.
        .execute(meta, key, () => lastValueFrom(next.handle(), { defaultValue: undefined }), context)
        .then(
          (result) => {
            if (result.kind === 'in_flight') {
              const inFlight = new EventInFlightError(
                duplicateInFlight(key),
                meta.scope,
                key,
                result.retryAfterSeconds,
                this.config.inFlightStatus,
              );
              subscriber.error(transport.failure(inFlight, context));
              return;
            }
            let value: unknown;
            try {
              value = transport.answer(result, context);
            } catch (error) {
              subscriber.error(error);
              return;
            }
            subscriber.next(value);
            subscriber.complete();
          },
          (error: unknown) => subscriber.error(transport.failure(error, context)),
        );
    });
  }

  /**
   * The transport for `context`, or undefined when none serves it. Override it to serve another
   * context type (`ws`, `graphql`) with your own DeliveryTransport.
   */
  protected transportFor(context: ExecutionContext): DeliveryTransport | undefined {
    return this.transports.get(context.getType());
  }
}
