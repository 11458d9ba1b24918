import { Body, Controller, Post, UseGuards } from '@nestjs/common';
import {
  IdempotencyContext,
  IdempotentWebhook,
  stripeEventKey,
  StripeSignatureGuard,
} from '../idempotency.js';
import type { FulfilmentRequest } from './fulfilment.client.js';
import { StripeEventPipe } from './stripe-event.pipe.js';
import { FULFILMENT_EVENTS, type FulfilmentEvent } from './stripe-events.schema.js';
import { FULFILMENT_QUEUE, STRIPE_SCOPES, STRIPE_SOURCE } from './stripe-scopes.js';
import { webhookAnswer, type WebhookAnswer } from './webhook-answer.js';

/**
 * `POST /webhooks/stripe/fulfilment-async`: acknowledge at once, fulfil in the background. Same
 * signature check and key (`event.id`) as the fulfilment endpoint, but transaction mode: the claim
 * and the fulfilment job commit in one transaction, and Stripe gets its 200 right after that
 * COMMIT, in milliseconds. FulfilmentWorker then calls the fulfilment API. A crash before the
 * COMMIT leaves neither claim nor job (Stripe retries); after it, the job is there. A
 * `checkout.session.completed` without the fields the job needs (StripeEventPipe) is answered 400
 * naming the field; the claim rolls back, and no job is queued.
 */
@Controller('webhooks/stripe')
@UseGuards(StripeSignatureGuard)
export class StripeFulfilmentAsyncController {
  constructor(private readonly context: IdempotencyContext) {}

  @Post('fulfilment-async')
  @IdempotentWebhook({ key: stripeEventKey, scope: STRIPE_SCOPES.fulfilmentAsync, source: STRIPE_SOURCE })
  async handle(@Body(new StripeEventPipe(FULFILMENT_EVENTS)) event: FulfilmentEvent): Promise<WebhookAnswer> {
    if ('ignored' in event) return webhookAnswer(event, 'ignored');
    const session = event.data.object;
    const request: FulfilmentRequest = {
      eventId: event.id,
      sessionId: session.id,
      email: session.customer_details?.email ?? session.customer_email ?? null,
    };
    // One fulfilment per event: the job's key is the event's id, which the worker's call then
    // carries downstream as the synchronous endpoint's does.
    await this.context.enqueue(FULFILMENT_QUEUE, request, { key: event.id });
    return webhookAnswer(event, 'fulfilment_queued');
  }
}
