export { IdempotencyModule } from './idempotency.module.js';
export { IDEMPOTENCY_MODULE_OPTIONS } from './idempotency.module-definition.js';
export { IdempotencyService } from './core/idempotency.service.js';
export { IdempotencyContext, type IdempotentDelivery } from './core/idempotency-context.js';
export { IdempotentWebhook } from './transports/idempotent-webhook.decorator.js';
export { WebhookTransaction } from './transports/webhook-transaction.decorator.js';
export { Idempotent } from './transports/method/idempotent.decorator.js';
export { IdempotencyInterceptor } from './transports/idempotency.interceptor.js';
export type { DeliveryTransport, SettledResult } from './transports/delivery-transport.js';
export type { IdempotencyRpcError } from './transports/rpc/rpc.transport.js';
export {
  EventInFlightException,
  IdempotencyUnavailableException,
  InvalidIdempotencyKeyException,
  TransactionAbortedException,
} from './transports/http/http-exceptions.js';
export {
  EventInFlightError,
  IdempotencyError,
  IdempotencyUnavailableError,
  InvalidIdempotencyKeyError,
  isIdempotencyError,
  PropagationError,
  TransactionAbortedError,
  type IdempotencyErrorCode,
} from './idempotency.errors.js';
export { Propagation } from './core/propagation.js';
export { IdempotencyMetrics } from './idempotency.metrics.js';
export { ExpiredLeaseReporter } from './maintenance/expired-lease.reporter.js';
export { IdempotencyClaims } from './operator/idempotency-claims.service.js';
export {
  IdempotentWorker,
  IDEMPOTENT_WORKER_METADATA,
} from './transports/queue/idempotent-worker.decorator.js';
export { QueueHandoff } from './transports/queue/queue-handoff.js';
export { HandoffMetrics } from './transports/queue/handoff-metrics.js';
export type { SqlExecutor } from './core/claim-strategy.js';
export {
  IDEMPOTENCY_ENTITIES,
  idempotencyEntities,
  ProcessedEvent,
  type ProcessedEventStatus,
} from './entities/processed-event.entity.js';
export { CreateProcessedEvents1764547200000 } from './migrations/1764547200000-create-processed-events.migration.js';
export { AddUnfinishedClaimsIndex1764892800000 } from './migrations/1764892800000-add-unfinished-claims-index.migration.js';
export { AddFailedClaimsIndex1765238400000 } from './migrations/1765238400000-add-failed-claims-index.migration.js';
export {
  IDEMPOTENCY_MIGRATIONS,
  processedEventsMigrations,
  type MigrationClass,
} from './migrations/processed-events.migrations.js';
export {
  IDEMPOTENT_METHOD_METADATA,
  IDEMPOTENT_WEBHOOK_METADATA,
  REPLAYED_HEADER,
} from './idempotency.constants.js';
export type { IdempotencyMode } from './strategies/claim-strategies.js';
export {
  githubDeliveryKey,
  shopifyWebhookKey,
  standardWebhookKey,
  stripeEventKey,
} from './keys/webhook-keys.js';
export type {
  ClaimListOptions,
  ClaimListStatus,
  ClaimOutcome,
  ClaimOutcomeEvent,
  ClaimRecord,
  ClaimRefusal,
  ClaimRefusalReason,
  ClaimState,
  ForgetClaimResult,
  ReleaseClaimResult,
  ReporterRunOptions,
  DeadLetteredJob,
  EnqueueOptions,
  ExpiredLease,
  HandedOffEvent,
  HandoffJob,
  HandoffOptions,
  HandoffQueueOptions,
  IdempotencyClaimOptions,
  IdempotencyKeyExtractor,
  IdempotencyModuleExtras,
  IdempotencyModuleOptions,
  IdempotentOptions,
  IdempotentRunOptions,
  IdempotentRunResult,
  IdempotentWebhookOptions,
  IdempotentWorkerOptions,
  JobOutcome,
  QueueStats,
  AbandonedClaim,
  PoisonEvent,
  ReporterRunResult,
} from './interfaces/index.js';
export { WebhookSignatureGuard } from './guards/webhook-signature.guard.js';
export { StripeSignatureGuard } from './guards/stripe-signature.guard.js';
export { GithubSignatureGuard } from './guards/github-signature.guard.js';
export { StandardWebhooksSignatureGuard } from './guards/standard-webhooks-signature.guard.js';
export { ShopifySignatureGuard } from './guards/shopify-signature.guard.js';
export {
  InvalidSignatureException,
  MalformedSignatureException,
  RawBodyUnavailableException,
  UnreadableBodyException,
  UnverifiableBodyException,
} from './guards/signature-exceptions.js';
export { WebhookSignatureError, type SignatureFailure } from './guards/webhook-signature.error.js';
export type {
  TimestampedWebhookSecretOptions,
  WebhookSecretOptions,
  WebhookSignatureName,
  WebhookSignatureOptions,
} from './interfaces/index.js';
