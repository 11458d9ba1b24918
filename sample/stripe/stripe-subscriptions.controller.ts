import { Body, Controller, Post, UseGuards } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import {
  IdempotentWebhook,
  stripeEventKey,
  stripeEventOrder,
  StripeSignatureGuard,
  WebhookTransaction,
} from '../idempotency.js';
import { StripeEventPipe } from './stripe-event.pipe.js';
import { SUBSCRIPTION_EVENTS, type SubscriptionsEvent } from './stripe-events.schema.js';
import { STRIPE_SCOPES, STRIPE_SOURCE } from './stripe-scopes.js';
import { SubscriptionsService } from './subscriptions.service.js';
import type { WebhookAnswer } from './webhook-answer.js';

/** The event types this endpoint applies, and the only ones its ordering guard orders. */
const SUBSCRIPTION_EVENT_TYPES = Object.keys(SUBSCRIPTION_EVENTS);

/**
 * `POST /webhooks/stripe/subscriptions`, transaction mode with the library's ordering guard:
 * `customer.subscription.created`, `.updated` and `.deleted` each carry the whole subscription, and
 * Stripe delivers them in any order (an `.updated` before the `.created`, an older `.updated` after
 * a newer one, every retry reshuffled). The guard orders them per subscription by the event's own
 * `created`, so the row always holds the newest event's snapshot: an older event is answered 200
 * `Idempotent-Stale: true` and applies nothing. Other event types are claimed, not ordered, and
 * answered 200 `"effect": "ignored"`.
 */
@Controller('webhooks/stripe')
@UseGuards(StripeSignatureGuard)
export class StripeSubscriptionsController {
  constructor(private readonly subscriptions: SubscriptionsService) {}

  @Post('subscriptions')
  @IdempotentWebhook({
    key: stripeEventKey,
    scope: STRIPE_SCOPES.subscriptions,
    source: STRIPE_SOURCE,
    order: stripeEventOrder({ types: SUBSCRIPTION_EVENT_TYPES }),
  })
  handle(
    @Body(new StripeEventPipe(SUBSCRIPTION_EVENTS)) event: SubscriptionsEvent,
    @WebhookTransaction() manager: EntityManager,
  ): Promise<WebhookAnswer> {
    return this.subscriptions.apply(event, manager);
  }
}
