import { Body, Controller, Post, UseGuards } from '@nestjs/common';
import { IdempotentWebhook, stripeEventKey, StripeSignatureGuard } from '../idempotency.js';
import { FulfilmentService } from './fulfilment.service.js';
import { StripeEventPipe } from './stripe-event.pipe.js';
import { FULFILMENT_EVENTS, type FulfilmentEvent } from './stripe-events.schema.js';
import { STRIPE_SCOPES, STRIPE_SOURCE } from './stripe-scopes.js';
import type { WebhookAnswer } from './webhook-answer.js';

/**
 * `POST /webhooks/stripe/fulfilment`, external mode: the claim is a lease on `event.id`. While it
 * is held, a duplicate is answered 409 with Retry-After (never 200 for unfinished work); if the
 * handler fails the lease is released at once; if the process dies the lease expires
 * (IDEMPOTENCY_LEASE_MS), the reporter logs it, and the next delivery runs the handler again. A
 * `checkout.session.completed` without the fields the API call needs (StripeEventPipe) is answered
 * 400 naming the field, before the call.
 */
@Controller('webhooks/stripe')
@UseGuards(StripeSignatureGuard)
export class StripeFulfilmentController {
  constructor(private readonly fulfilment: FulfilmentService) {}

  @Post('fulfilment')
  @IdempotentWebhook({
    key: stripeEventKey,
    scope: STRIPE_SCOPES.fulfilment,
    source: STRIPE_SOURCE,
    external: true,
  })
  handle(@Body(new StripeEventPipe(FULFILMENT_EVENTS)) event: FulfilmentEvent): Promise<WebhookAnswer> {
    return this.fulfilment.apply(event);
  }
}
