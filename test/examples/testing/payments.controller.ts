import { BadGatewayException, Body, Controller, Post } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import { IdempotencyContext, IdempotentWebhook, WebhookTransaction } from '../../../lib/index.js';

/** A payment event as the sender posts it; `id` is the event's own id, the same on every retry. */
export interface PaymentEvent {
  id: string;
  amount: number;
}

@Controller('webhooks')
export class PaymentsController {
  constructor(private readonly context: IdempotencyContext) {}

  /** Transaction mode: the payment row commits with the claim, or neither does. */
  @Post('payments')
  @IdempotentWebhook({ key: (event: PaymentEvent) => event.id })
  async payment(@Body() event: PaymentEvent, @WebhookTransaction() manager: EntityManager) {
    await manager.query('INSERT INTO payments (event_id, amount) VALUES ($1, $2)', [event.id, event.amount]);
    return { recorded: event.id };
  }

  /** External mode: a call no transaction can undo, so the receipts API is told the event's key. */
  @Post('receipts')
  @IdempotentWebhook({ key: (event: PaymentEvent) => event.id, external: true })
  async receipt(@Body() event: PaymentEvent) {
    const response = await fetch(process.env.RECEIPTS_URL!, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': this.context.downstreamKey },
      body: JSON.stringify({ eventId: event.id, amount: event.amount }),
    });
    if (!response.ok) throw new BadGatewayException(`receipts API answered ${response.status}`);
    return { sent: event.id };
  }
}
