import { DEFAULTS } from './idempotency.constants.js';
import type { IdempotencyConfig, IdempotencyModuleOptions } from './interfaces/index.js';

/** Positive-number options, checked at start-up so a typo fails fast rather than at the first event. */
const POSITIVE = [
  'leaseMs',
  'retryAfterSeconds',
  'maxKeyLength',
  'reportEveryMs',
  'maxAttempts',
  'retentionDays',
  'retentionBatchSize',
  'slowTransactionWarnMs',
] as const;

/** Numbers only: '10' from an unparsed environment variable would work only by coercion. */
const isPositive = (value: unknown) => typeof value === 'number' && value > 0;

/** Merges the defaults into the user's options and rejects values that cannot work. */
export function resolveIdempotencyConfig(options: IdempotencyModuleOptions = {}): IdempotencyConfig {
  const defined = Object.fromEntries(Object.entries(options).filter(([, value]) => value !== undefined));
  const config: IdempotencyConfig = {
    ...DEFAULTS,
    reporter: true,
    prometheus: true,
    preparedStatements: true,
    ...defined,
  } as IdempotencyConfig;
  for (const name of POSITIVE) {
    if (!isPositive(config[name])) {
      throw new Error(
        `IdempotencyModule option ${name} must be a positive number, got ${String(config[name])}`,
      );
    }
  }
  const wait = config.concurrentDuplicateWaitMs;
  if (typeof wait !== 'number' || !(wait >= 0)) {
    throw new Error(
      `IdempotencyModule option concurrentDuplicateWaitMs must be zero or more, got ${String(config.concurrentDuplicateWaitMs)}`,
    );
  }
  if (!Number.isInteger(config.retryAfterSeconds)) {
    // Retry-After takes whole seconds (RFC 9110); 0.5 would be an invalid header.
    throw new Error(
      `IdempotencyModule option retryAfterSeconds must be a whole number, got ${config.retryAfterSeconds}`,
    );
  }
  if (config.inFlightStatus !== 409 && config.inFlightStatus !== 503) {
    throw new Error(
      `IdempotencyModule option inFlightStatus must be 409 or 503, got ${String(config.inFlightStatus)}`,
    );
  }
  return config;
}
