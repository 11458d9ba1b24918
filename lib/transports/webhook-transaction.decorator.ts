import { createParamDecorator } from '@nestjs/common';
import { currentDelivery } from '../core/idempotency-context.js';

const outsideTransaction = () => '@WebhookTransaction() is only available in an @IdempotentWebhook handler';

/**
 * What `@WebhookTransaction()` injects: the manager of the current delivery's claim transaction.
 * A function of its own so that the explorer can find the decorator on a handler at boot (it
 * refuses it on an external-mode handler, which has no claim transaction).
 */
export function webhookTransactionManager(): unknown {
  const delivery = currentDelivery();
  if (!delivery) throw new Error(outsideTransaction());
  return delivery.manager;
}

/**
 * Injects the EntityManager of the claim's transaction into a transaction-mode
 * `@IdempotentWebhook` handler, over HTTP or RPC. Writes through it commit with the claim, or not
 * at all. An external-mode handler has no claim transaction: there the boot fails, naming it.
 */
export const WebhookTransaction = createParamDecorator(webhookTransactionManager);
