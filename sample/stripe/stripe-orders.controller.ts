import { Body, Controller, Post, UseGuards } from '@nestjs/common';
import type Stripe from 'stripe';
import type { EntityManager } from 'typeorm';
import {
  IdempotentWebhook,
  stripeEventKey,
  StripeSignatureGuard,
  WebhookTransaction,
} from '../idempotency.js';
import { OrdersService } from './orders.service.js';
import { STRIPE_SCOPES, STRIPE_SOURCE } from './stripe-scopes.js';
import type { WebhookAnswer } from './webhook-answer.js';

/**
 * `POST /webhooks/stripe/orders`, transaction mode: the claim of `event.id` and the handler's
 * writes commit together. A repeat is answered 200 with `Idempotent-Replayed: true` without
 * calling the handler; a crash or a throw rolls both back, so the redelivery runs it cleanly.
 */
@Controller('webhooks/stripe')
@UseGuards(StripeSignatureGuard)
export class StripeOrdersController {
  constructor(private readonly orders: OrdersService) {}

  @Post('orders')
  @IdempotentWebhook({ key: stripeEventKey, scope: STRIPE_SCOPES.orders, source: STRIPE_SOURCE })
  handle(@Body() event: Stripe.Event, @WebhookTransaction() manager: EntityManager): Promise<WebhookAnswer> {
    return this.orders.apply(event, manager);
  }
}
