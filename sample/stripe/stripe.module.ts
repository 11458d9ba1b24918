import { Module } from '@nestjs/common';
import { FulfilmentClient } from './fulfilment.client.js';
import { FulfilmentService } from './fulfilment.service.js';
import { FulfilmentWorker } from './fulfilment.worker.js';
import { OrdersService } from './orders.service.js';
import { StripeFulfilmentAsyncController } from './stripe-fulfilment-async.controller.js';
import { StripeFulfilmentController } from './stripe-fulfilment.controller.js';
import { StripeOrdersController } from './stripe-orders.controller.js';
import { StripeSubscriptionsController } from './stripe-subscriptions.controller.js';
import { SubscriptionsService } from './subscriptions.service.js';

/**
 * Stripe webhooks: four endpoints behind the library's StripeSignatureGuard (its secret is the
 * IdempotencyModule's `signatures.stripe`), each with its own claim scope, and the worker the
 * async fulfilment endpoint hands its jobs to.
 */
@Module({
  controllers: [
    StripeOrdersController,
    StripeFulfilmentController,
    StripeFulfilmentAsyncController,
    StripeSubscriptionsController,
  ],
  providers: [OrdersService, FulfilmentService, FulfilmentClient, FulfilmentWorker, SubscriptionsService],
})
export class StripeModule {}
