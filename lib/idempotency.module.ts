import { Module } from '@nestjs/common';
import { LeaseClaim } from './claims/lease-claim.js';
import { TransactionClaim } from './claims/transaction-claim.js';
import { ExpiredLeaseReporter } from './expired-lease.reporter.js';
import { resolveIdempotencyConfig } from './idempotency.config.js';
import { IDEMPOTENCY_CONFIG } from './idempotency.constants.js';
import { IdempotencyContext } from './idempotency-context.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';
import { IdempotencyMetrics } from './idempotency.metrics.js';
import { ConfigurableModuleClass, IDEMPOTENCY_MODULE_OPTIONS } from './idempotency.module-definition.js';

/**
 * Exactly-one-effect webhook handlers on PostgreSQL + TypeORM.
 *
 * ```ts
 * @Module({
 *   imports: [
 *     TypeOrmModule.forRoot({ type: 'postgres', url, entities: [...IDEMPOTENCY_ENTITIES] }),
 *     ScheduleModule.forRoot(), // once, for the expired-lease reporter
 *     IdempotencyModule.forRoot({ leaseMs: 300_000 }),
 *   ],
 * })
 * ```
 * Global by default (`isGlobal: false` to opt out); uses the default DataSource unless
 * `dataSource: 'name'` is given.
 */
@Module({
  providers: [
    {
      provide: IDEMPOTENCY_CONFIG,
      inject: [IDEMPOTENCY_MODULE_OPTIONS],
      useFactory: resolveIdempotencyConfig,
    },
    IdempotencyMetrics,
    TransactionClaim,
    LeaseClaim,
    IdempotencyInterceptor,
    IdempotencyContext,
    ExpiredLeaseReporter,
  ],
  exports: [
    IDEMPOTENCY_CONFIG,
    IdempotencyMetrics,
    TransactionClaim,
    LeaseClaim,
    IdempotencyInterceptor,
    IdempotencyContext,
    ExpiredLeaseReporter,
  ],
})
export class IdempotencyModule extends ConfigurableModuleClass {}
