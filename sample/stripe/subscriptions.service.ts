import { Injectable, Logger } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import { Subscription } from './entities/subscription.entity.js';
import type { SubscriptionsEvent } from './stripe-events.schema.js';
import { webhookAnswer, type WebhookAnswer } from './webhook-answer.js';

/**
 * Applies subscription snapshots in the claim's transaction. It writes whatever the event says:
 * the ordering guard on the endpoint has already answered an event older than the one applied
 * (stale: this is not called), so this never needs to compare anything itself.
 */
@Injectable()
export class SubscriptionsService {
  private readonly logger = new Logger(SubscriptionsService.name);

  /** Writes the subscription as `event` has it, through `manager` (the claim's transaction). */
  async apply(event: SubscriptionsEvent, manager: EntityManager): Promise<WebhookAnswer> {
    // Not ordered and not applied: claimed all the same, so a redelivery is a replay.
    if ('ignored' in event) return webhookAnswer(event, 'ignored');
    const subscription = event.data.object;
    // `.deleted` keeps the row, with the status the event carries (`canceled`): deleting it would
    // let nothing tell a late `.updated` for a cancelled subscription from one for a new id.
    await manager.upsert(
      Subscription,
      { id: subscription.id, status: subscription.status, eventId: event.id },
      ['id'],
    );
    this.logger.log(`${event.id}: subscription ${subscription.id} is ${subscription.status}`);
    return webhookAnswer(event, `subscription_${subscription.status}`);
  }
}
