/**
 * The root entry: what an app imports to make its handlers idempotent, and nothing else (at most
 * 32 runtime names; test/unit/public-surface.spec.ts counts them). What only some apps import
 * has an entry of its own, in both builds:
 * - `nest-idempotent-webhooks/errors`: every error class, for `instanceof` and `@Catch()` of one
 *   kind (the root has the base class, WebhookSignatureError, and `isIdempotencyError()`);
 * - `nest-idempotent-webhooks/operator`: claims by hand, the handoff's queues, the console;
 * - `nest-idempotent-webhooks/observability`: metrics, the health indicator, diagnostics channels;
 * - `nest-idempotent-webhooks/testing`: helpers for an app's own tests.
 * Internals (metadata keys, the claim runner, SQL executors, single migrations) stay out; tests
 * reach them by relative import.
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
  ClaimOutcome,
  ClaimOutcomeEvent,
} from './interfaces/index.js';
export type { TelemetryOptions } from './observability/telemetry-options.js';

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

// Errors: one family, each an HttpException with its status, told apart by `code`. The base
// class (for `@Catch(IdempotencyError)`), the guards' one signature error, and the check that
// narrows to a code's class; every class by value is on `nest-idempotent-webhooks/errors`.
export {
  IdempotencyError,
  isIdempotencyError,
  type EventInFlightError,
  type IdempotencyErrorCode,
  type IdempotencyKeyReusedError,
  type IdempotencyOwnerUnknownError,
  type IdempotencyUnavailableError,
  type InvalidEventOrderError,
  type InvalidIdempotencyKeyError,
  type MissingIdempotencyKeyError,
  type ProblemDetails,
  type PropagationError,
  type ResponseNotStoredError,
  type TransactionAbortedError,
  type UnparsedRequestBodyError,
} from './idempotency.errors.js';
export { WebhookSignatureError, type SignatureFailure } from './guards/webhook-signature.error.js';
export type { IdempotencyRpcError } from './transports/rpc/rpc.transport.js';

// The answers' headers.
export { REPLAYED_HEADER, STALE_HEADER } from './idempotency.constants.js';

// The claims table: its entities and its migrations, for the default table or one of your own.
export {
  idempotencyEntities,
  ProcessedEvent,
  type ProcessedEventStatus,
} from './entities/processed-event.entity.js';
export { ProcessedEventVersion } from './entities/processed-event-version.entity.js';
export { processedEventsMigrations, type MigrationClass } from './migrations/processed-events.migrations.js';

// The reporter of expired leases, which every app with external-mode handlers runs.
export { ExpiredLeaseReporter } from './maintenance/expired-lease.reporter.js';
export type {
  AbandonedClaim,
  ExpiredLease,
  PoisonEvent,
  ReporterRunOptions,
  ReporterRunResult,
} from './interfaces/index.js';
