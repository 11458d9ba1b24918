import { checkSignatureOptions } from './guards/signature-options.js';
import { closest } from './core/closest-name.js';
import { DEFAULTS, MAX_TIMER_MS } from './idempotency.constants.js';
import { DEFAULT_TABLE } from './postgres/claim-table.js';
import { resolveHandoffOptions } from './transports/queue/handoff-options.js';
import { resolveTelemetryOptions } from './observability/telemetry-options.js';
import { unknownOption } from './idempotency.messages.js';
import type { IdempotencyConfig, IdempotencyModuleOptions } from './interfaces/index.js';

const optionNotPositive = (name: string, value: unknown) =>
  `IdempotencyModule option ${name} must be a positive number, got ${String(value)}`;

const optionNotNonNegative = (name: string, value: unknown) =>
  `IdempotencyModule option ${name} must be zero or more, got ${String(value)}`;

const optionTooLarge = (name: string, value: number, max: number) =>
  `IdempotencyModule option ${name} must be at most ${max} ms (the longest timer Node can set), got ${value}`;

const optionNotWhole = (name: string, value: unknown) =>
  `IdempotencyModule option ${name} must be a whole number (at most 2^53 - 1), got ${String(value)}`;

const optionNotOneOf = (name: string, allowed: readonly unknown[], value: unknown) =>
  `IdempotencyModule option ${name} must be ${allowed.join(' or ')}, got ${String(value)}`;

/**
 * Every option, so a misspelt one fails the boot instead of being ignored (`leaseMss: 1000` would
 * otherwise leave the 5-minute default in force). The Record type makes a new option that is not
 * listed here a compile error.
 */
const KNOWN_OPTIONS: Record<keyof IdempotencyModuleOptions, true> = {
  leaseMs: true,
  concurrentDuplicateWaitMs: true,
  retryAfterSeconds: true,
  maxKeyLength: true,
  slowTransactionWarnMs: true,
  inFlightStatus: true,
  reportEveryMs: true,
  reportCron: true,
  reporter: true,
  maxAttempts: true,
  retentionDays: true,
  retentionBatchSize: true,
  retentionMaxBatches: true,
  onExpiredLeases: true,
  onOutcome: true,
  prometheus: true,
  telemetry: true,
  preparedStatements: true,
  schema: true,
  table: true,
  signatures: true,
  handoff: true,
  strictTransactions: true,
  detectUnstableKeys: true,
  unstableKeyWindowMs: true,
  maxStoredResponseBytes: true,
};

/** Positive-number options, checked at start-up so a typo fails fast rather than at the first event. */
const POSITIVE = [
  'leaseMs',
  'retryAfterSeconds',
  'maxKeyLength',
  'reportEveryMs',
  'maxAttempts',
  'retentionDays',
  'retentionBatchSize',
  'retentionMaxBatches',
  'slowTransactionWarnMs',
  'unstableKeyWindowMs',
  'maxStoredResponseBytes',
] as const;

/** Options that count whole things: seconds in a header, rows in a batch. */
const WHOLE = [
  'retryAfterSeconds',
  'retentionBatchSize',
  'retentionMaxBatches',
  'maxStoredResponseBytes',
] as const;

/**
 * Millisecond options that become timers or intervals: above MAX_TIMER_MS Node fires them after
 * 1 ms (a heartbeat or a report every millisecond), and Postgres cannot add Infinity to now().
 */
const TIMED = [
  'leaseMs',
  'reportEveryMs',
  'slowTransactionWarnMs',
  'concurrentDuplicateWaitMs',
  'unstableKeyWindowMs',
] as const;

/** Numbers only: '10' from an unparsed environment variable would work only by coercion. */
const isPositive = (value: unknown) => typeof value === 'number' && value > 0;

/** Merges the defaults into the user's options and rejects values that cannot work. */
export function resolveIdempotencyConfig(options: IdempotencyModuleOptions = {}): IdempotencyConfig {
  const known = Object.keys(KNOWN_OPTIONS);
  for (const name of Object.keys(options ?? {})) {
    if (!Object.hasOwn(KNOWN_OPTIONS, name)) throw new Error(unknownOption(name, closest(name, known)));
  }
  const defined = Object.fromEntries(Object.entries(options).filter(([, value]) => value !== undefined));
  const config: IdempotencyConfig = {
    ...DEFAULTS,
    reporter: true,
    prometheus: true,
    preparedStatements: 'auto',
    strictTransactions: false,
    // A development-time detector by default; it is cheap enough to keep on (see the option).
    detectUnstableKeys: process.env.NODE_ENV !== 'production',
    table: DEFAULT_TABLE,
    ...defined,
  } as IdempotencyConfig;
  for (const name of POSITIVE) {
    if (!isPositive(config[name])) throw new Error(optionNotPositive(name, config[name]));
  }
  const wait = config.concurrentDuplicateWaitMs;
  if (typeof wait !== 'number' || !(wait >= 0)) {
    throw new Error(optionNotNonNegative('concurrentDuplicateWaitMs', wait));
  }
  for (const name of TIMED) {
    if (config[name] > MAX_TIMER_MS) throw new Error(optionTooLarge(name, config[name], MAX_TIMER_MS));
  }
  // Retry-After takes whole seconds (RFC 9110); 0.5 would be an invalid header. The batch sizes are
  // counts of rows, and retentionBatchSize is written into the retention statements' LIMIT.
  for (const name of WHOLE) {
    if (!Number.isSafeInteger(config[name])) throw new Error(optionNotWhole(name, config[name]));
  }
  if (typeof config.strictTransactions !== 'boolean') {
    throw new Error(optionNotOneOf('strictTransactions', [true, false], config.strictTransactions));
  }
  if (typeof config.detectUnstableKeys !== 'boolean') {
    throw new Error(optionNotOneOf('detectUnstableKeys', [true, false], config.detectUnstableKeys));
  }
  if (config.inFlightStatus !== 409 && config.inFlightStatus !== 503) {
    throw new Error(optionNotOneOf('inFlightStatus', [409, 503], config.inFlightStatus));
  }
  if (config.signatures !== undefined) {
    config.signatures = checkSignatureOptions(config.signatures, closest);
  }
  // Checked here so a mistake fails the boot with the other options; the handoff resolves it again.
  if (config.handoff !== undefined) resolveHandoffOptions(config.handoff, closest);
  // Likewise the telemetry option, which DeliveryTelemetry resolves at init.
  resolveTelemetryOptions(config.telemetry);
  return config;
}
