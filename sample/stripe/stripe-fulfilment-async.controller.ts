import { Body, Controller, Post, UseGuards } from '@nestjs/common';
import type Stripe from 'stripe';
import {
  IdempotencyContext,
  IdempotentWebhook,
  stripeEventKey,
  StripeSignatureGuard,
} from '../idempotency.js';
import type { FulfilmentRequest } from './fulfilment.client.js';
import { FULFILMENT_QUEUE, STRIPE_SCOPES, STRIPE_SOURCE } from './stripe-scopes.js';
import { webhookAnswer, type WebhookAnswer } from './webhook-answer.js';

/**
 * `POST /webhooks/stripe/fulfilment-async`: acknowledge at once, fulfil in the background. Same
 * signature check and key (`event.id`) as the fulfilment endpoint, but transaction mode: the claim
 * and the fulfilment job commit in one transaction, and Stripe gets its 200 right after that
 * COMMIT, in milliseconds. FulfilmentWorker then calls the fulfilment API. A crash before the
 * COMMIT leaves neither claim nor job (Stripe retries); after it, the job is there.
 */
@Controller('webhooks/stripe')
@UseGuards(StripeSignatureGuard)
export class StripeFulfilmentAsyncController {
  constructor(private readonly context: IdempotencyContext) {}

  @Post('fulfilment-async')
  @IdempotentWebhook({ key: stripeEventKey, scope: STRIPE_SCOPES.fulfilmentAsync, source: STRIPE_SOURCE })
  async handle(@Body() event: Stripe.Event): Promise<WebhookAnswer> {
    if (event.type !== 'checkout.session.completed') return webhookAnswer(event, 'ignored');
    const session = event.data.object;
    const request: FulfilmentRequest = {
      eventId: event.id,
      sessionId: session.id,
      email: session.customer_details?.email ?? session.customer_email ?? null,
    };
    await this.context.enqueue(FULFILMENT_QUEUE, request);
    return webhookAnswer(event, 'fulfilment_queued');
  }
}
