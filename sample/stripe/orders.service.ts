import { Injectable, Logger } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import { Invoice } from './entities/invoice.entity.js';
import { Order } from './entities/order.entity.js';
import type { InvoicePaidEvent, OrdersEvent, PaymentIntentSucceededEvent } from './stripe-events.schema.js';
import { webhookAnswer, type WebhookAnswer } from './webhook-answer.js';

/**
 * The orders side of the sample: database writes only, so they run in the claim's transaction and
 * commit with it, or not at all. A crash anywhere in here leaves neither the order nor the claim.
 */
@Injectable()
export class OrdersService {
  private readonly logger = new Logger(OrdersService.name);

  /** Applies one verified and validated event through `manager`, the claim's transaction. */
  async apply(event: OrdersEvent, manager: EntityManager): Promise<WebhookAnswer> {
    // Claimed all the same: a redelivery is answered as a replay without calling this again.
    if ('ignored' in event) return webhookAnswer(event, 'ignored');
    switch (event.type) {
      case 'payment_intent.succeeded':
        return webhookAnswer(event, await this.createOrder(event, manager));
      case 'invoice.paid':
        return webhookAnswer(event, await this.markInvoicePaid(event, manager));
    }
  }

  private async createOrder(event: PaymentIntentSucceededEvent, manager: EntityManager) {
    const intent = event.data.object;
    // ON CONFLICT DO NOTHING on the unique event id: should the claims table ever be emptied,
    // a redelivery is still one order, not a 500 the sender would retry for days.
    const result = await manager
      .createQueryBuilder()
      .insert()
      .into(Order)
      .values({
        stripeEventId: event.id,
        paymentIntentId: intent.id,
        // What was actually charged, not what was asked for.
        amount: intent.amount_received,
        currency: intent.currency,
      })
      .orIgnore()
      .execute();
    // RETURNING gives a row only when the insert happened.
    const created = (result.raw as unknown[]).length > 0;
    this.logger.log(`${event.id}: ${created ? 'order created' : 'order already existed'} for ${intent.id}`);
    return created ? 'order_created' : 'order_exists';
  }

  /** The seed's conditional update: `UPDATE invoices SET status = 'paid' WHERE id = $1 AND status = 'pending'`. */
  private async markInvoicePaid(event: InvoicePaidEvent, manager: EntityManager) {
    const invoice = event.data.object;
    const result = await manager
      .createQueryBuilder()
      .update(Invoice)
      .set({ status: 'paid', paidAt: () => 'now()' })
      .where('id = :id AND status = :pending', { id: invoice.id, pending: 'pending' })
      .execute();
    const paid = result.affected === 1;
    this.logger.log(`${event.id}: invoice ${invoice.id} ${paid ? 'marked paid' : 'unchanged (not pending)'}`);
    return paid ? 'invoice_paid' : 'invoice_unchanged';
  }
}
