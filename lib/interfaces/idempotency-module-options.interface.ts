import type { ClaimOutcomeEvent } from './claim-outcome.interface.js';
import type { ExpiredLease } from './expired-lease.interface.js';
import type { HandoffOptions } from './handoff.interface.js';
import type { TelemetryOptions } from '../observability/telemetry-options.js';

/**
 * Options of `IdempotencyModule.forRoot()` / the object returned by `forRootAsync`'s `useFactory`.
 * Every field is optional; the defaults suit Stripe and GitHub deliveries.
 */
export interface IdempotencyModuleOptions {
  /**
   * How long an external-mode claim (`external: true`) is held before another worker may take it
   * over. Longer than your slowest realistic handler, shorter than your patience.
   * @default 300000 (5 minutes)
   */
  leaseMs?: number;
  /**
   * How long a concurrent duplicate waits for the first delivery's open transaction (Postgres
   * `lock_timeout` on the claim) before it is answered in flight: in transaction mode, and for an
   * external-mode claim that meets an open transaction-mode claim of its scope. Bounds how many
   * pool connections a duplicate storm can hold.
   * @default 5000
   */
  concurrentDuplicateWaitMs?: number;
  /**
   * `Retry-After` (seconds) on 503 answers and on 409 in transaction mode; the cap for the
   * lease-derived `Retry-After` in external mode.
   * @default 30
   */
  retryAfterSeconds?: number;
  /**
   * Longest key accepted (UTF-16 code units); longer keys get 400 and nothing is written. Raised
   * far above the default, a key is also refused when it and its scope take more than 2600 bytes
   * of UTF-8: PostgreSQL's index on the claims table cannot hold a larger entry.
   * @default 255
   */
  maxKeyLength?: number;
  /**
   * A transactional handler holding its transaction longer than this gets a warning (once per
   * handler per minute): its work probably belongs in external mode.
   * @default 10000
   */
  slowTransactionWarnMs?: number;
  /**
   * Status of every in-flight answer, in either mode: a duplicate that finds the event held by
   * another delivery (a live lease, or a transaction still open after `concurrentDuplicateWaitMs`).
   * @default 409
   */
  inFlightStatus?: 409 | 503;
  /**
   * How often the expired-lease reporter runs, in milliseconds. Ignored when `reportCron` is set.
   * @default 60000
   */
  reportEveryMs?: number;
  /**
   * Cron expression for the expired-lease reporter, instead of `reportEveryMs`.
   * @default undefined
   */
  reportCron?: string;
  /**
   * Register the expired-lease reporter (needs `ScheduleModule.forRoot()` in the app).
   * @default true
   */
  reporter?: boolean;
  /**
   * Claims that took this many attempts or more are reported as poison events.
   * @default 5
   */
  maxAttempts?: number;
  /**
   * Done rows older than this are deleted by the reporter, and so are claims that never finished
   * (failed, or a dead lease) last claimed that long ago (each logged). Keep it longer than the
   * sender's retry window (Stripe: 3 days) or old redeliveries will run again.
   * @default 30
   */
  retentionDays?: number;
  /**
   * Rows deleted per statement by retention, so one run never holds a long lock.
   * @default 5000
   */
  retentionBatchSize?: number;
  /**
   * Retention statements per run, for done rows and again for abandoned ones, so one run stays
   * bounded after a long outage. With `retentionBatchSize` and `reportEveryMs` it sets the rate
   * retention keeps up with: 5000 × 100 a minute is 8,333 events a second.
   * @default 100
   */
  retentionMaxBatches?: number;
  /**
   * Called with the expired leases found by each reporter run that found any.
   * @default undefined
   */
  onExpiredLeases?: (leases: ExpiredLease[]) => void | Promise<void>;
  /**
   * Called for every counted outcome (claimed, replayed, in_flight, ...), for metrics other than
   * prom-client. Must not throw; errors are logged and ignored.
   * @default undefined
   */
  onOutcome?: (event: ClaimOutcomeEvent) => void;
  /**
   * Export `idempotency_claims_total` and `idempotency_expired_leases` to prom-client (an optional
   * peer dependency): `true` uses prom-client's default registry, or pass a registry; `false` never
   * loads prom-client.
   * @default true (used only when prom-client is installed)
   */
  prometheus?: boolean | { registers: unknown[] };
  /**
   * Spans and duration histograms (see docs/observability.md): a span per delivery through
   * `@opentelemetry/api` when it is installed, the handoff's trace context, and the claim and
   * handler duration histograms on prom-client and the OpenTelemetry meter.
   * @default { openTelemetry: true, durationBuckets: [0.001, ..., 10] }
   */
  telemetry?: TelemetryOptions;
  /**
   * Prepare the statements of every delivery once per connection, so Postgres skips parsing and
   * planning them each time: transaction mode sends `BEGIN; EXECUTE idempotency_transaction_claim(...)`
   * as one query, external mode sends protocol-level named statements. Behind a pooler in
   * transaction mode (PgBouncer `pool_mode = transaction`, Supavisor; RDS Proxy pins connections on PREPARE instead: set `false` there), a
   * delivery can land on a server connection that never prepared them, or already has them: such a
   * statement fails without running and is sent again unprepared (a round trip, never a 503).
   * `'auto'` stops preparing after a few such misses and says so in a warning; `true` keeps
   * preparing; `false` never prepares (transaction mode then sends `BEGIN` and the claim with its
   * values inlined, still one round trip). See docs/operations-and-poolers.md, "Connection poolers".
   * @default 'auto'
   */
  preparedStatements?: boolean | 'auto';
  /**
   * Schema of the claims table; every statement names it. The migration and entity for a table
   * elsewhere come from `processedEventsMigrations()` and `idempotencyEntities()`.
   * @default the DataSource's `schema` option, else the connection's search_path
   */
  schema?: string;
  /**
   * Name of the claims table.
   * @default 'processed_events'
   */
  table?: string;
  /**
   * Signing secrets of the senders whose signature guards the app uses (`StripeSignatureGuard`,
   * `GithubSignatureGuard`, `StandardWebhooksSignatureGuard`, `ShopifySignatureGuard`, or
   * `@IdempotentWebhook({ signature })`). A route behind a guard whose sender has no secret here
   * fails the boot. An array of secrets passes a delivery signed with any of them, for rotation.
   * Unknown keys fail the boot.
   * @default undefined (no sender configured)
   */
  signatures?: WebhookSignatureOptions;
  /**
   * During a transaction-mode delivery, a write sent through TypeORM on the claims' DataSource but
   * not through the claim's manager (an injected repository, `dataSource.query()`, a transaction of
   * its own) commits on its own and brings back the hole the claim closes. It is always detected
   * and logged once per handler, naming the entity; `true` also refuses it before it runs (the
   * delivery fails and rolls back, nothing is written). PostgreSQL's own parser decides what is a
   * write; a statement whose effect its text cannot show (a function of the app's own, CALL, DO)
   * is logged, never refused. Raw SQL through pg itself is not seen.
   * @default false
   */
  strictTransactions?: boolean;
  /**
   * Hand deliveries off to workers through pg-boss (an optional peer dependency, ^10.4):
   * `IdempotencyContext.enqueue()` writes a job in the claim's transaction and
   * `@IdempotentWorker` methods run each job under a claim of their own. pg-boss runs on the
   * DataSource's pool, in its own schema. See docs/handoff.md.
   * @default undefined (pg-boss is never loaded)
   */
  handoff?: HandoffOptions;
  /**
   * Look for keys that change between copies of one event (a timestamp, a per-request UUID): the
   * same webhook fingerprint arriving under a second key within `unstableKeyWindowMs` is logged
   * once per handler and counted (`key_unstable`). In memory, per process (a copy that reaches
   * another replica is not compared): under a microsecond per delivery and about 380 bytes per
   * fingerprint remembered (at most 10,000: under 4 MB), so it can stay on (docs/idempotency-key.md
   * has the measurement).
   * @default true unless NODE_ENV is 'production'
   */
  detectUnstableKeys?: boolean;
  /**
   * How long a webhook fingerprint is remembered for `detectUnstableKeys`, in ms (at most 10,000
   * fingerprints per process, the oldest forgotten first).
   * @default 3600000 (1 hour)
   */
  unstableKeyWindowMs?: number;
  /**
   * The largest response body `@IdempotentRequest` routes store for their replays, in bytes of its
   * JSON (a route's own `maxStoredResponseBytes` overrides it). See that option for what happens
   * over it.
   * @default 65536
   */
  maxStoredResponseBytes?: number;
}

/** One sender's signing secret; several during a rotation (a delivery signed with any passes). */
export interface WebhookSecretOptions {
  /**
   * The signing secret, or secrets during a rotation. Non-empty, without leading or trailing
   * whitespace (a pasted newline would make every signature fail).
   */
  secret: string | string[];
}

/** A sender that signs a timestamp: deliveries older (or further in the future) are refused. */
export interface TimestampedWebhookSecretOptions extends WebhookSecretOptions {
  /**
   * How far the signed timestamp may be from now, in seconds; outside it the delivery is answered
   * 401 as a possible replay.
   * @default 300
   */
  toleranceSeconds?: number;
}

/** `signatures` of the module options: one entry per sender the app verifies. */
export interface WebhookSignatureOptions {
  /**
   * Stripe's endpoint signing secret (`whsec_...`), checked by the stripe SDK (an optional peer
   * dependency) over `Stripe-Signature`. Stripe checks only age, not future timestamps.
   * @default undefined
   */
  stripe?: TimestampedWebhookSecretOptions;
  /**
   * The webhook's secret, checked as HMAC-SHA256 over `X-Hub-Signature-256`.
   * @default undefined
   */
  github?: WebhookSecretOptions;
  /**
   * The endpoint's `whsec_<base64>` secret (Svix, Resend, ...), checked over `webhook-id`,
   * `webhook-timestamp` and `webhook-signature`.
   * @default undefined
   */
  standardWebhooks?: TimestampedWebhookSecretOptions;
  /**
   * The app's client secret, checked as base64 HMAC-SHA256 over `X-Shopify-Hmac-Sha256`.
   * @default undefined
   */
  shopify?: WebhookSecretOptions;
}

/** Extras of forRoot/forRootAsync: they shape the module, so they stay outside `useFactory`. */
export interface IdempotencyModuleExtras {
  /**
   * Name of the @nestjs/typeorm DataSource the claims use (the same name given to
   * `TypeOrmModule.forRoot({ name })`).
   * @default the default DataSource
   */
  dataSource?: string;
}

/** The options with every default applied; what the library's services read. */
export type IdempotencyConfig = Required<
  Omit<
    IdempotencyModuleOptions,
    'reportCron' | 'onExpiredLeases' | 'onOutcome' | 'signatures' | 'schema' | 'handoff' | 'telemetry'
  >
> &
  Pick<
    IdempotencyModuleOptions,
    'reportCron' | 'onExpiredLeases' | 'onOutcome' | 'signatures' | 'schema' | 'handoff' | 'telemetry'
  >;
