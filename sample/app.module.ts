import { Module, type DynamicModule } from '@nestjs/common';
import { ScheduleModule } from '@nestjs/schedule';
import type { SampleConfig } from './config/sample-config.js';
import { SAMPLE_CONFIG, SampleConfigModule } from './config/sample-config.module.js';
import { DatabaseModule } from './database/database.module.js';
import { HealthModule } from './health/health.module.js';
import { IdempotencyModule } from './idempotency.js';
import { MetricsModule } from './metrics/metrics.module.js';
import { StripeModule } from './stripe/stripe.module.js';

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
          }),
        }),
        StripeModule,
        HealthModule,
        MetricsModule,
      ],
    };
  }
}
