import { Module } from '@nestjs/common';
import { RefundsController } from './refunds.controller.js';

/** The sample's own API: `POST /refunds`, made idempotent by the Idempotency-Key header. */
@Module({ controllers: [RefundsController] })
export class RefundsModule {}
