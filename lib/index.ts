export { IdempotencyModule } from './idempotency.module.js';
export { IDEMPOTENCY_MODULE_OPTIONS } from './idempotency.module-definition.js';
export { IdempotentWebhook } from './decorators/idempotent-webhook.decorator.js';
export { WebhookTransaction } from './decorators/webhook-transaction.decorator.js';
export { IdempotencyInterceptor } from './idempotency.interceptor.js';
export { IdempotencyContext } from './idempotency-context.js';
export { IdempotencyMetrics } from './idempotency.metrics.js';
export { ExpiredLeaseReporter } from './expired-lease.reporter.js';
export {
  IDEMPOTENCY_ENTITIES,
  ProcessedEvent,
  type ProcessedEventStatus,
} from './entities/processed-event.entity.js';
export { CreateProcessedEvents1764547200000 } from './migrations/1764547200000-create-processed-events.migration.js';
export { IDEMPOTENT_WEBHOOK_METADATA, REPLAYED_HEADER } from './idempotency.constants.js';
export {
  githubDeliveryKey,
  shopifyWebhookKey,
  standardWebhookKey,
  stripeEventKey,
} from './providers/webhook-keys.js';
export type {
  ClaimOutcome,
  ClaimOutcomeEvent,
  ExpiredLease,
  IdempotencyKeyExtractor,
  IdempotencyModuleExtras,
  IdempotencyModuleOptions,
  IdempotentWebhookOptions,
  PoisonEvent,
  ReporterRunResult,
} from './interfaces/index.js';
