import { createParamDecorator } from '@nestjs/common';
import { currentIdempotencyStore } from '../idempotency-context.js';

/**
 * Injects the EntityManager of the claim's transaction (transaction mode) or the DataSource's
 * manager (external mode) into an `@IdempotentWebhook` handler. Writes through it commit with the
 * claim, or not at all.
 */
export const WebhookTransaction = createParamDecorator(() => {
  const store = currentIdempotencyStore();
  if (!store) throw new Error('@WebhookTransaction() is only available in an @IdempotentWebhook handler');
  return store.manager;
});
