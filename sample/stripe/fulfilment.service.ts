import { Injectable, Logger } from '@nestjs/common';
import { IdempotencyContext } from '../idempotency.js';
import { FulfilmentClient } from './fulfilment.client.js';
import type { FulfilmentEvent } from './stripe-events.schema.js';
import { webhookAnswer, type WebhookAnswer } from './webhook-answer.js';

/**
 * The fulfilment side of the sample: it calls an API outside the database, so it runs under a
 * lease (external mode) rather than in a transaction. It reads the delivery's attempt and
 * downstreamKey (the event's key, header-safe) from IdempotencyContext, which the library makes
 * available to any service the handler calls.
 */
@Injectable()
export class FulfilmentService {
  private readonly logger = new Logger(FulfilmentService.name);

  constructor(
    private readonly client: FulfilmentClient,
    private readonly context: IdempotencyContext,
  ) {}

  /** Fulfils a validated `checkout.session.completed`; answers any other type `ignored`. */
  async apply(event: FulfilmentEvent): Promise<WebhookAnswer> {
    if ('ignored' in event) return webhookAnswer(event, 'ignored');

    const session = event.data.object;
    const attempt = this.context.attempt ?? 1;
    if (attempt > 1) {
      // An earlier attempt died or failed holding this event; it may have reached the API.
      this.logger.warn(`${event.id}: attempt ${attempt}, the fulfilment API may already have seen it`);
    }
    const outcome = await this.client.send(
      {
        eventId: event.id,
        sessionId: session.id,
        email: session.customer_details?.email ?? session.customer_email ?? null,
      },
      // The event's key in a form any header carries, the same on every attempt.
      this.context.downstreamKey,
    );
    if (outcome === 'sent') this.logger.log(`${event.id}: fulfilment sent for ${session.id}`);
    return webhookAnswer(event, outcome === 'sent' ? 'fulfilment_sent' : 'fulfilment_logged');
  }
}
