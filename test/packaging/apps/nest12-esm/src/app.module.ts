import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { idempotencyEntities, IdempotencyModule, processedEventsMigrations } from 'nest-idempotent-webhooks';
import { CreateOrders1764547300000 } from './create-orders.migration.js';
import { Order } from './order.entity.js';
import { OrdersService } from './orders.service.js';
import { WebhookController } from './webhook.controller.js';

/** The app: its DataSource (DATABASE_URL, migrated at start-up) and the library's module. */
@Module({
  imports: [
    TypeOrmModule.forRoot({
      type: 'postgres',
      url: process.env.DATABASE_URL,
      entities: [Order, ...idempotencyEntities()],
      migrations: [...processedEventsMigrations(), CreateOrders1764547300000],
      migrationsRun: true,
    }),
    IdempotencyModule.forRoot({}),
  ],
  controllers: [WebhookController],
  providers: [OrdersService],
})
export class AppModule {}
