/**
 * The sample's settings, read once from the environment at start-up. Every variable is optional;
 * an empty value counts as unset (docker-compose and CI often pass `VAR=`).
 */
export interface SampleConfig {
  /** HTTP port. `PORT`, @default 3000 */
  port: number;
  /** Postgres connection string. `DATABASE_URL`, @default undefined: an embedded PostgreSQL under `.data/` */
  databaseUrl: string | undefined;
  /** Stripe signing secret (`whsec_...`). `STRIPE_WEBHOOK_SECRET`, @default DEV_WEBHOOK_SECRET */
  webhookSecret: string;
  /** True when `webhookSecret` is the development default, so start-up can say so. */
  usingDevSecret: boolean;
  /** Lease of the external-mode (fulfilment) handler, ms. `IDEMPOTENCY_LEASE_MS`, @default 300000 */
  leaseMs: number;
  /** How often expired leases are looked for, ms. `IDEMPOTENCY_REPORT_INTERVAL_MS`, @default 60000 */
  reportIntervalMs: number;
  /** Downstream fulfilment API. `FULFILMENT_URL`, @default undefined: fulfilment is only logged */
  fulfilmentUrl: string | undefined;
}

/**
 * Signing secret used when STRIPE_WEBHOOK_SECRET is unset. Public on purpose: `npm run sample:send`
 * signs with the same value, so the demo works with no setup. Never use it outside development.
 */
export const DEV_WEBHOOK_SECRET = 'whsec_sample_development_secret_do_not_use_in_production';

/** A setting that cannot work; start-up reports its message alone, without a stack. */
export class SampleConfigError extends Error {
  override name = 'SampleConfigError';
}

type Env = Record<string, string | undefined>;

/** Reads and checks the configuration; a bad value fails at start-up, not at the first event. */
export function loadSampleConfig(env: Env = process.env): SampleConfig {
  const secret = read(env, 'STRIPE_WEBHOOK_SECRET');
  return {
    port: integer(env, 'PORT', 3000, 1, 65_535),
    databaseUrl: read(env, 'DATABASE_URL'),
    webhookSecret: secret ?? DEV_WEBHOOK_SECRET,
    usingDevSecret: secret === undefined,
    leaseMs: integer(env, 'IDEMPOTENCY_LEASE_MS', 300_000, 1),
    reportIntervalMs: integer(env, 'IDEMPOTENCY_REPORT_INTERVAL_MS', 60_000, 1),
    fulfilmentUrl: httpUrl(env, 'FULFILMENT_URL'),
  };
}

function read(env: Env, name: string): string | undefined {
  const value = env[name]?.trim();
  return value ? value : undefined;
}

function integer(env: Env, name: string, fallback: number, min: number, max = Number.MAX_SAFE_INTEGER) {
  const raw = read(env, name);
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new SampleConfigError(`${name} must be a whole number from ${min} to ${max}, got "${raw}"`);
  }
  return value;
}

function httpUrl(env: Env, name: string): string | undefined {
  const raw = read(env, name);
  if (raw === undefined) return undefined;
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new SampleConfigError(`${name} must be an http(s) URL, got "${raw}"`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new SampleConfigError(`${name} must be an http(s) URL, got "${raw}"`);
  }
  return url.toString();
}
