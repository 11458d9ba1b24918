import { Module } from '@nestjs/common';
import { FulfilmentClient } from './fulfilment.client.js';
import { FulfilmentService } from './fulfilment.service.js';
import { OrdersService } from './orders.service.js';
import { StripeFulfilmentController } from './stripe-fulfilment.controller.js';
import { StripeOrdersController } from './stripe-orders.controller.js';
import { StripeSignatureGuard } from './stripe-signature.guard.js';

/** Stripe webhooks: two endpoints behind one signature guard, each with its own claim scope. */
@Module({
  controllers: [StripeOrdersController, StripeFulfilmentController],
  providers: [StripeSignatureGuard, OrdersService, FulfilmentService, FulfilmentClient],
})
export class StripeModule {}
