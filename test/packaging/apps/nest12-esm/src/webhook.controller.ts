import { Body, Controller, Post } from '@nestjs/common';
import { IdempotentWebhook } from 'nest-idempotent-webhooks';
import { OrdersService } from './orders.service.js';

/** A webhook event as a sender would post it. */
export interface OrderEvent {
  id: string;
}

/** The app's webhook: records an order per event, through the claim's transaction. */
@Controller('webhooks')
export class WebhookController {
  constructor(private readonly orders: OrdersService) {}

  @Post('orders')
  @IdempotentWebhook({ key: (event: OrderEvent) => event.id })
  async handle(@Body() event: OrderEvent): Promise<{ recorded: string }> {
    await this.orders.record(event.id);
    return { recorded: event.id };
  }
}
