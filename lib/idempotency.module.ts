import { Module } from '@nestjs/common';
import { DiscoveryModule } from '@nestjs/core';
import { IdempotencyContext } from './core/idempotency-context.js';
import { ClaimRunner } from './core/claim-runner.js';
import { IdempotencyService } from './core/idempotency.service.js';
import { JOB_ENQUEUER } from './core/job-enqueuer.js';
import { SignatureGuardsExplorer } from './guards/signature-guards.explorer.js';
import { resolveIdempotencyConfig } from './idempotency.config.js';
import { IDEMPOTENCY_CONFIG } from './idempotency.constants.js';
import { IdempotencyMetrics } from './idempotency.metrics.js';
import { ConfigurableModuleClass, IDEMPOTENCY_MODULE_OPTIONS } from './idempotency.module-definition.js';
import { IdempotencyHealthIndicator } from './health/idempotency-health.indicator.js';
import { ClaimRetention } from './maintenance/claim-retention.service.js';
import { ExpiredLeaseReporter } from './maintenance/expired-lease.reporter.js';
import { PoisonEventReporter } from './maintenance/poison-event.reporter.js';
import { DeliveryTelemetry } from './observability/delivery-telemetry.js';
import { IdempotencyClaims } from './operator/idempotency-claims.service.js';
import { ClaimDatabase } from './postgres/claim-database.js';
import { claimStrategyProviders } from './strategies/claim-strategies.js';
import { RetryAfterEstimator } from './strategies/retry-after.estimator.js';
import { deliveryTransportProviders } from './transports/delivery-transports.js';
import { HttpTransport } from './transports/http/http.transport.js';
import { RpcTransport } from './transports/rpc/rpc.transport.js';
import { IdempotencyExplorer } from './transports/idempotency.explorer.js';
import { IdempotencyInterceptor } from './transports/idempotency.interceptor.js';
import { KeyFindings } from './transports/key-findings.js';
import { OrderingExplorer } from './transports/ordering.explorer.js';
import { HandoffMetrics } from './transports/queue/handoff-metrics.js';
import { HandoffQueues } from './transports/queue/handoff-queues.service.js';
import { QueueHandoff } from './transports/queue/queue-handoff.js';

/**
 * Exactly-one-effect event handlers on PostgreSQL + TypeORM, over HTTP, microservices and queues.
 *
 * ```ts
 * @Module({
 *   imports: [
 *     TypeOrmModule.forRoot({ type: 'postgres', url, entities: [...idempotencyEntities()] }),
 *     ScheduleModule.forRoot(), // once, for the expired-lease reporter
 *     IdempotencyModule.forRoot({ leaseMs: 300_000 }),
 *   ],
 * })
 * ```
 * Global by default (`isGlobal: false` to opt out); uses the default DataSource unless
 * `dataSource: 'name'` is given.
 */
@Module({
  imports: [DiscoveryModule],
  providers: [
    {
      provide: IDEMPOTENCY_CONFIG,
      inject: [IDEMPOTENCY_MODULE_OPTIONS],
      useFactory: resolveIdempotencyConfig,
    },
    IdempotencyMetrics,
    // Spans and duration histograms (lib/observability/), idle without prom-client and OpenTelemetry.
    DeliveryTelemetry,
    ClaimDatabase,
    RetryAfterEstimator,
    ...claimStrategyProviders,
    ClaimRunner,
    IdempotencyService,
    ...deliveryTransportProviders,
    IdempotencyInterceptor,
    // Key checks: key_conflict and key_unstable, logged once per handler.
    KeyFindings,
    IdempotencyExplorer,
    // Checks the versions table at boot when a handler has an ordering guard.
    OrderingExplorer,
    SignatureGuardsExplorer,
    IdempotencyContext,
    // Maintenance: the reporter schedules the tick and runs the poison report and retention in it.
    ExpiredLeaseReporter,
    PoisonEventReporter,
    ClaimRetention,
    IdempotencyClaims,
    IdempotencyHealthIndicator,
    // The handoff to workers (pg-boss), idle without the handoff option.
    HandoffMetrics,
    QueueHandoff,
    HandoffQueues,
    { provide: JOB_ENQUEUER, useExisting: QueueHandoff },
  ],
  // The interceptor is instantiated in whichever module declares the controller, and an
  // @Idempotent provider anywhere gets the service and config injected: both need these exported.
  exports: [
    IDEMPOTENCY_CONFIG,
    HttpTransport,
    RpcTransport,
    IdempotencyMetrics,
    ClaimRunner,
    IdempotencyService,
    IdempotencyInterceptor,
    KeyFindings,
    IdempotencyContext,
    ExpiredLeaseReporter,
    IdempotencyClaims,
    IdempotencyHealthIndicator,
    HandoffMetrics,
    HandoffQueues,
  ],
})
export class IdempotencyModule extends ConfigurableModuleClass {}
