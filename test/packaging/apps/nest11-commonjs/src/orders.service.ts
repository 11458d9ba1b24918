import { Injectable } from '@nestjs/common';
import { IdempotencyContext } from 'nest-idempotent-webhooks';
import { Order } from './order.entity';

/** Writes through the claim's transaction, which it reaches through IdempotencyContext. */
@Injectable()
export class OrdersService {
  constructor(private readonly context: IdempotencyContext) {}

  async record(eventId: string): Promise<void> {
    await this.context.manager.insert(Order, { eventId });
  }
}
