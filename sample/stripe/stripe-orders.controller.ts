import { Body, Controller, Post, UseGuards } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import {
  IdempotentWebhook,
  stripeEventKey,
  StripeSignatureGuard,
  WebhookTransaction,
} from '../idempotency.js';
import { OrdersService } from './orders.service.js';
import { StripeEventPipe } from './stripe-event.pipe.js';
import { ORDERS_EVENTS, type OrdersEvent } from './stripe-events.schema.js';
import { STRIPE_SCOPES, STRIPE_SOURCE } from './stripe-scopes.js';
import type { WebhookAnswer } from './webhook-answer.js';

/**
 * `POST /webhooks/stripe/orders`, transaction mode: the claim of `event.id` and the handler's
 * writes commit together. A repeat is answered 200 with `Idempotent-Replayed: true` without
 * calling the handler; a crash or a throw rolls both back, so the redelivery runs it cleanly. An
 * event of a type it acts on that lacks a field it writes (StripeEventPipe) is answered 400 naming
 * the field, and its claim rolls back too.
 */
@Controller('webhooks/stripe')
@UseGuards(StripeSignatureGuard)
export class StripeOrdersController {
  constructor(private readonly orders: OrdersService) {}

  @Post('orders')
  @IdempotentWebhook({ key: stripeEventKey, scope: STRIPE_SCOPES.orders, source: STRIPE_SOURCE })
  handle(
    @Body(new StripeEventPipe(ORDERS_EVENTS)) event: OrdersEvent,
    @WebhookTransaction() manager: EntityManager,
  ): Promise<WebhookAnswer> {
    return this.orders.apply(event, manager);
  }
}
