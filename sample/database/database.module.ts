import { Module, type DynamicModule } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { DataSource } from 'typeorm';
import { idempotencyEntities, processedEventsMigrations } from '../idempotency.js';
import { Invoice } from '../stripe/entities/invoice.entity.js';
import { Order } from '../stripe/entities/order.entity.js';
import { Refund } from '../refunds/refund.entity.js';
import { Subscription } from '../stripe/entities/subscription.entity.js';
import { CreateOrdersAndInvoices1764633600000 } from './migrations/1764633600000-create-orders-and-invoices.migration.js';
import { CreateRefunds1765584000001 } from './migrations/1765584000001-create-refunds.migration.js';
import { CreateSubscriptions1765756800000 } from './migrations/1765756800000-create-subscriptions.migration.js';
import { runMigrationsOnce } from './run-migrations.js';

/** Shows up in `pg_stat_activity`, so the sample's sessions are easy to find. */
export const DATABASE_APPLICATION_NAME = 'stripe-sample';

/**
 * TypeORM on the sample's database. The schema comes from migrations run at start (the library's,
 * then the sample's own), never from `synchronize`: this is how a production app would do it.
 */
@Module({})
export class DatabaseModule {
  static forRoot(url: string): DynamicModule {
    return {
      module: DatabaseModule,
      imports: [
        TypeOrmModule.forRootAsync({
          useFactory: () => ({
            type: 'postgres' as const,
            url,
            applicationName: DATABASE_APPLICATION_NAME,
            // The library's entity is registered explicitly, next to the app's own.
            entities: [Order, Invoice, Refund, Subscription, ...idempotencyEntities()],
            migrations: [
              ...processedEventsMigrations(),
              CreateOrdersAndInvoices1764633600000,
              CreateRefunds1765584000001,
              CreateSubscriptions1765756800000,
            ],
            // A database that cannot be reached must fail a delivery (503), not hang it.
            connectTimeoutMS: 5_000,
            // Fail fast at start-up: a wrong DATABASE_URL should not take half a minute to report.
            retryAttempts: 3,
            retryDelay: 1_000,
          }),
          // Migrate before any provider can use the DataSource.
          dataSourceFactory: async (options) =>
            runMigrationsOnce(await new DataSource(options!).initialize()),
        }),
      ],
    };
  }
}
