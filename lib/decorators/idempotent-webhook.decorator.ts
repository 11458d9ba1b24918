import { applyDecorators, HttpCode, SetMetadata, UseInterceptors } from '@nestjs/common';
import { IDEMPOTENT_WEBHOOK_METADATA } from '../idempotency.constants.js';
import { IdempotencyInterceptor } from '../idempotency.interceptor.js';
import type { IdempotentWebhookMetadata, IdempotentWebhookOptions } from '../interfaces/index.js';

/**
 * Makes a controller method safe under at-least-once delivery: every event has exactly one
 * visible effect. Alone it is enough: it applies the interceptor and answers 200 (webhook senders
 * expect 200, Nest answers POST with 201).
 *
 * ```ts
 * @Post('stripe')
 * @IdempotentWebhook({ key: (event) => event.id })
 * handle(@Body() event: Stripe.Event, @WebhookTransaction() manager: EntityManager) { ... }
 * ```
 *
 * Transaction mode (default): write through the transaction's manager; claim and writes commit
 * together. `external: true`: a lease claim for work outside the database.
 */
export function IdempotentWebhook(options: IdempotentWebhookOptions): MethodDecorator {
  if (typeof options?.key !== 'function') {
    throw new TypeError('@IdempotentWebhook needs a key function, e.g. { key: (event) => event.id }');
  }
  if (options.leaseMs !== undefined && !(options.leaseMs > 0)) {
    throw new TypeError(
      `@IdempotentWebhook leaseMs must be a positive number of milliseconds, got ${options.leaseMs}`,
    );
  }
  return (target, propertyKey, descriptor) => {
    const scope = options.scope ?? `${target.constructor.name}.${String(propertyKey)}`;
    const metadata: IdempotentWebhookMetadata = {
      ...options,
      scope,
      source: options.source ?? scope,
      external: options.external ?? false,
    };
    applyDecorators(
      SetMetadata(IDEMPOTENT_WEBHOOK_METADATA, metadata),
      UseInterceptors(IdempotencyInterceptor),
      HttpCode(200),
    )(target, propertyKey, descriptor);
  };
}
