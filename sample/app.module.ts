import { Module, type DynamicModule } from '@nestjs/common';
import { ScheduleModule } from '@nestjs/schedule';
import type { SampleConfig } from './config/sample-config.js';
import { SAMPLE_CONFIG, SampleConfigModule } from './config/sample-config.module.js';
import { DatabaseModule } from './database/database.module.js';
import { HealthModule } from './health/health.module.js';
import { IdempotencyModule } from './idempotency.js';
import { MetricsModule } from './metrics/metrics.module.js';
import { RefundsModule } from './refunds/refunds.module.js';
import { FULFILMENT_QUEUE } from './stripe/stripe-scopes.js';
import { StripeModule } from './stripe/stripe.module.js';

/** pg-boss refuses a job expiry of 24 hours or more. */
const MAX_EXPIRY_SECONDS = 86_399;

/**
 * The whole sample. `databaseUrl` is the resolved one (DATABASE_URL or the embedded server's),
 * which main.ts knows only after it has started the database.
 */
@Module({})
export class AppModule {
  static forRoot(config: SampleConfig, databaseUrl: string): DynamicModule {
    return {
      module: AppModule,
      imports: [
        SampleConfigModule.forRoot(config),
        DatabaseModule.forRoot(databaseUrl),
        // Once, here: the library registers its expired-lease reporter through SchedulerRegistry
        // and must not import ScheduleModule itself (each import would run the job again).
        ScheduleModule.forRoot(),
        IdempotencyModule.forRootAsync({
          inject: [SAMPLE_CONFIG],
          useFactory: (settings: SampleConfig) => ({
            leaseMs: settings.leaseMs,
            reportEveryMs: settings.reportIntervalMs,
            // The library's StripeSignatureGuard on both endpoints verifies with this secret.
            signatures: { stripe: { secret: settings.webhookSecret } },
            // The async fulfilment endpoint's jobs (pg-boss, in the `pgboss` schema of the same
            // database). A job expires with the worker's lease (IDEMPOTENCY_LEASE_MS), and
            // maintenance looks for expired ones every 5 s, so a killed worker's job is handed
            // out again within the lease plus a few seconds. A failed job is retried after 3-6 s,
            // then 6-12, 12-24 and 24-48 s, then dead-lettered.
            handoff: {
              queues: {
                [FULFILMENT_QUEUE]: {
                  expireInSeconds: Math.min(MAX_EXPIRY_SECONDS, Math.ceil(settings.leaseMs / 1000)),
                  retryLimit: 4,
                  retryDelaySeconds: 3,
                  retryBackoff: true,
                },
              },
              maintenanceIntervalSeconds: 5,
              pollingIntervalMs: 1_000,
              // Within the shutdown's 10 s drain (lifecycle/graceful-shutdown.ts).
              drainMs: 8_000,
            },
          }),
        }),
        StripeModule,
        RefundsModule,
        HealthModule,
        MetricsModule,
      ],
    };
  }
}
