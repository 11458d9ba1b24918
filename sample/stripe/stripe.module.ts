import { Module } from '@nestjs/common';
import { FulfilmentClient } from './fulfilment.client.js';
import { FulfilmentService } from './fulfilment.service.js';
import { OrdersService } from './orders.service.js';
import { StripeFulfilmentController } from './stripe-fulfilment.controller.js';
import { StripeOrdersController } from './stripe-orders.controller.js';

/**
 * Stripe webhooks: two endpoints behind the library's StripeSignatureGuard (its secret is the
 * IdempotencyModule's `signatures.stripe`), each with its own claim scope.
 */
@Module({
  controllers: [StripeOrdersController, StripeFulfilmentController],
  providers: [OrdersService, FulfilmentService, FulfilmentClient],
})
export class StripeModule {}
