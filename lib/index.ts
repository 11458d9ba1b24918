/**
 * The public surface: what an app imports, and nothing else. Internals (metadata keys, the claim
 * runner, SQL executors, single migrations) stay out; tests reach them by relative import.
 */

// The module and its options.
export { IdempotencyModule } from './idempotency.module.js';
export type {
  IdempotencyModuleExtras,
  IdempotencyModuleOptions,
  WebhookSecretOptions,
  TimestampedWebhookSecretOptions,
  WebhookSignatureOptions,
  HandoffOptions,
  HandoffQueueOptions,
} from './interfaces/index.js';

// Making handlers idempotent: HTTP and microservice handlers, provider methods, plain calls, workers.
export { IdempotentWebhook } from './transports/idempotent-webhook.decorator.js';
export { IdempotentRequest } from './transports/idempotent-request.decorator.js';
export { WebhookTransaction } from './transports/webhook-transaction.decorator.js';
export { Idempotent } from './transports/method/idempotent.decorator.js';
export { IdempotentWorker } from './transports/queue/idempotent-worker.decorator.js';
export { IdempotencyService } from './core/idempotency.service.js';
export { IdempotencyInterceptor } from './transports/idempotency.interceptor.js';
export { Propagation } from './core/propagation.js';
export type {
  IdempotencyClaimOptions,
  IdempotencyKeyExtractor,
  IdempotentOptions,
  IdempotentRunOptions,
  IdempotentRunResult,
  IdempotentRequestOptions,
  IdempotentWebhookOptions,
  IdempotentWorkerOptions,
  WebhookFingerprint,
  WebhookSignatureName,
  EventOrderExtractor,
  EventOrderOptions,
} from './interfaces/index.js';
export type { StoredResponse } from './core/claim-check.js';
export type { IdempotencyMode } from './strategies/claim-strategies.js';
export type { DeliveryTransport, SettledResult } from './transports/delivery-transport.js';

// Inside a delivery.
export { IdempotencyContext, type IdempotentDelivery } from './core/idempotency-context.js';
export type { EnqueueOptions, HandedOffEvent, HandoffJob } from './interfaces/index.js';

// Keys of the senders the library knows.
export {
  githubDeliveryKey,
  shopifyWebhookKey,
  standardWebhookKey,
  stripeEventKey,
} from './keys/webhook-keys.js';

// Ordering guards for the senders the library knows: the newest event of each object wins.
export {
  isoTimestampVersion,
  shopifyWebhookOrder,
  standardWebhookOrder,
  stripeEventOrder,
  type ShopifyWebhookOrderOptions,
  type StripeEventOrderOptions,
} from './keys/webhook-orders.js';

// Signature guards.
export { WebhookSignatureGuard } from './guards/webhook-signature.guard.js';
export { StripeSignatureGuard } from './guards/stripe-signature.guard.js';
export { GithubSignatureGuard } from './guards/github-signature.guard.js';
export { StandardWebhooksSignatureGuard } from './guards/standard-webhooks-signature.guard.js';
export { ShopifySignatureGuard } from './guards/shopify-signature.guard.js';

// Errors: one family, each an HttpException with its status (idempotency.errors.ts).
export {
  EventInFlightError,
  IdempotencyError,
  IdempotencyKeyReusedError,
  IdempotencyOwnerUnknownError,
  IdempotencyUnavailableError,
  InvalidEventOrderError,
  InvalidIdempotencyKeyError,
  isIdempotencyError,
  MissingIdempotencyKeyError,
  PropagationError,
  ResponseNotStoredError,
  TransactionAbortedError,
  UnparsedRequestBodyError,
  type IdempotencyErrorCode,
  type ProblemDetails,
} from './idempotency.errors.js';
export { WebhookSignatureError, type SignatureFailure } from './guards/webhook-signature.error.js';
export {
  InvalidSignatureException,
  MalformedSignatureException,
  RawBodyUnavailableException,
  UnreadableBodyException,
  UnverifiableBodyException,
} from './guards/signature-exceptions.js';
export {
  EventInFlightException,
  IdempotencyUnavailableException,
  InvalidIdempotencyKeyException,
  TransactionAbortedException,
} from './transports/http/http-exceptions.js';
export type { IdempotencyRpcError } from './transports/rpc/rpc.transport.js';
export { REPLAYED_HEADER, STALE_HEADER } from './idempotency.constants.js';

// The claims table: entity and migrations.
export {
  IDEMPOTENCY_ENTITIES,
  idempotencyEntities,
  ProcessedEvent,
  type ProcessedEventStatus,
} from './entities/processed-event.entity.js';
export { ProcessedEventVersion } from './entities/processed-event-version.entity.js';
export {
  IDEMPOTENCY_MIGRATIONS,
  processedEventsMigrations,
  type MigrationClass,
} from './migrations/processed-events.migrations.js';

// Operating it: the reporter, claims by hand, the handoff's queues, metrics.
export { ExpiredLeaseReporter } from './maintenance/expired-lease.reporter.js';
export { IdempotencyClaims } from './operator/idempotency-claims.service.js';
export { HandoffQueues } from './transports/queue/handoff-queues.service.js';
export { IdempotencyMetrics } from './idempotency.metrics.js';
export { IdempotencyConsoleModule } from './console/idempotency-console.module.js';
export type { IdempotencyConsoleOptions } from './console/console-options.js';
export { IDEMPOTENCY_CHANNELS, type OutcomeChannelMessage } from './observability/outcome-channels.js';
export type { TelemetryOptions } from './observability/telemetry-options.js';
export { HandoffMetrics } from './transports/queue/handoff-metrics.js';
export {
  IdempotencyHealthIndicator,
  type IdempotencyHealthDetails,
  type IdempotencyHealthOptions,
  type IdempotencyHealthResult,
  type QueueHealth,
} from './health/idempotency-health.indicator.js';
export type {
  AbandonedClaim,
  ClaimListOptions,
  ClaimListStatus,
  ClaimOutcome,
  ClaimOutcomeEvent,
  ClaimRecord,
  ClaimRefusal,
  ClaimRefusalReason,
  ClaimState,
  DeadLetteredJob,
  ExpiredLease,
  ForgetClaimResult,
  JobOutcome,
  PoisonEvent,
  QueueStats,
  ReleaseClaimResult,
  ReporterRunOptions,
  ReporterRunResult,
  RetryDeadLetterResult,
} from './interfaces/index.js';
