/** Metadata key under which `@IdempotentWebhook` stores its resolved options on the handler. */
export const IDEMPOTENT_WEBHOOK_METADATA = 'idempotency:webhook';

/** Metadata key under which `@Idempotent` stores its resolved options on the method's wrapper. */
export const IDEMPOTENT_METHOD_METADATA = 'idempotency:method';

/** DI token of the DataSource the claims run on (the default one or the one named in `dataSource`). */
export const IDEMPOTENCY_DATA_SOURCE = Symbol('IDEMPOTENCY_DATA_SOURCE');

/** DI token of the module options with every default filled in. */
export const IDEMPOTENCY_CONFIG = Symbol('IDEMPOTENCY_CONFIG');

/** Response header set on answers to deliveries that were already processed. */
export const REPLAYED_HEADER = 'Idempotent-Replayed';

/**
 * Response header (`true`) set on answers to deliveries the ordering guard found stale: older than
 * the version already applied to their entity, so not applied (docs/ordering.md).
 */
export const STALE_HEADER = 'Idempotent-Stale';

/** Scope under which the expired-lease reporter claims its ticks, so one replica reports per tick. */
export const REPORTER_SCOPE = 'idempotency:expired-lease-reporter';

/** Name of the job registered with SchedulerRegistry. */
export const REPORTER_JOB_NAME = 'idempotency-expired-lease-reporter';

/**
 * The longest delay Node's timers take (2^31 - 1 ms, about 24.8 days); a longer one fires after
 * 1 ms. Every millisecond option is bounded by it.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** Every default in one place; the option JSDoc repeats them. */
export const DEFAULTS = {
  leaseMs: 300_000,
  concurrentDuplicateWaitMs: 5_000,
  retryAfterSeconds: 30,
  maxKeyLength: 255,
  slowTransactionWarnMs: 10_000,
  inFlightStatus: 409,
  reportEveryMs: 60_000,
  maxAttempts: 5,
  retentionDays: 30,
  retentionBatchSize: 5_000,
  retentionMaxBatches: 100,
  maxErrorLength: 500,
  unstableKeyWindowMs: 3_600_000,
  maxStoredResponseBytes: 65_536,
} as const;

/** Fingerprints remembered per process for `detectUnstableKeys`, the oldest forgotten first. */
export const MAX_REMEMBERED_FINGERPRINTS = 10_000;
