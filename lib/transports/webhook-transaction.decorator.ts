import { createParamDecorator } from '@nestjs/common';
import { currentDelivery } from '../core/idempotency-context.js';
import { outsideTransaction } from '../idempotency.messages.js';

/**
 * Injects the EntityManager of the claim's transaction (transaction mode) or the DataSource's
 * manager (external mode) into an `@IdempotentWebhook` handler, over HTTP or RPC. Writes through
 * it commit with the claim, or not at all.
 */
export const WebhookTransaction = createParamDecorator(() => {
  const delivery = currentDelivery();
  if (!delivery) throw new Error(outsideTransaction());
  return delivery.manager;
});
