import { MAX_TIMER_MS } from '../../idempotency.constants.js';
import { unknownOption } from '../../idempotency.messages.js';
import type { HandoffOptions, HandoffQueueOptions } from '../../interfaces/index.js';

const badHandoffOption = (path: string, detail: string) => `IdempotencyModule option ${path} ${detail}`;

/** The handoff's defaults; the option JSDoc repeats them. */
export const HANDOFF_DEFAULTS = {
  schema: 'pgboss',
  drainMs: 10_000,
  pollingIntervalMs: 2_000,
  maintenanceIntervalSeconds: 60,
  retryLimit: 5,
  retryDelaySeconds: 10,
  retryBackoff: true,
  expireInSeconds: 900,
} as const;

/** pg-boss refuses an expiry or a maintenance interval of 24 hours or more. */
const MAX_PG_BOSS_SECONDS = 24 * 60 * 60 - 1;
/** A worker polling more often than this would only load the database. */
const MIN_POLLING_INTERVAL_MS = 50;

/** pg-boss's rule for a schema name (a Postgres identifier it interpolates unquoted). */
const SCHEMA_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,49}$/;
/** Queue names pg-boss 10 and later accept, so a queue made here survives an upgrade. */
const QUEUE_NAME = /^[A-Za-z0-9_.\-/]{1,100}$/;

/** A queue's settings with every default applied. */
export type QueueSettings = Required<HandoffQueueOptions>;

/** The handoff options with every default applied and every queue's settings resolved. */
export interface HandoffConfig {
  schema: string;
  drainMs: number;
  pollingIntervalMs: number;
  maintenanceIntervalSeconds: number;
  queues: Map<string, QueueSettings>;
}

/** Suggests the known name closest to a misspelt one (the config's edit-distance helper). */
export type Suggest = (name: string, candidates: string[]) => string | undefined;

const TOP_LEVEL: Record<keyof HandoffOptions, true> = {
  schema: true,
  queues: true,
  drainMs: true,
  pollingIntervalMs: true,
  maintenanceIntervalSeconds: true,
};
const QUEUE_LEVEL: Record<keyof HandoffQueueOptions, true> = {
  retryLimit: true,
  retryDelaySeconds: true,
  retryBackoff: true,
  expireInSeconds: true,
  deadLetter: true,
};

/** True for a name pg-boss takes as a queue. */
export function isQueueName(name: unknown): name is string {
  return typeof name === 'string' && QUEUE_NAME.test(name);
}

/** The dead-letter queue of `queue` when its options name none. */
export const defaultDeadLetter = (queue: string) => `${queue}.dead-letter`;

/**
 * Checks the `handoff` option at boot and resolves it: known keys only, each value of the type
 * and range pg-boss accepts, every failure naming its option path. Returns a copy, so later
 * changes to the caller's object cannot bypass the check.
 */
export function resolveHandoffOptions(value: unknown, suggest: Suggest): HandoffConfig {
  const options = checkObject('handoff', value, TOP_LEVEL, suggest) as HandoffOptions;
  const fail = (path: string, detail: string) => new Error(badHandoffOption(path, detail));
  const schema = options.schema ?? HANDOFF_DEFAULTS.schema;
  if (typeof schema !== 'string' || !SCHEMA_NAME.test(schema)) {
    throw fail(
      'handoff.schema',
      `must be a Postgres name of letters, digits and underscores (at most 50), got ${show(schema)}`,
    );
  }
  const config: HandoffConfig = {
    schema,
    drainMs: milliseconds('handoff.drainMs', options.drainMs, HANDOFF_DEFAULTS.drainMs, 0),
    pollingIntervalMs: milliseconds(
      'handoff.pollingIntervalMs',
      options.pollingIntervalMs,
      HANDOFF_DEFAULTS.pollingIntervalMs,
      MIN_POLLING_INTERVAL_MS,
    ),
    maintenanceIntervalSeconds: whole(
      'handoff.maintenanceIntervalSeconds',
      options.maintenanceIntervalSeconds,
      HANDOFF_DEFAULTS.maintenanceIntervalSeconds,
      1,
      MAX_PG_BOSS_SECONDS,
    ),
    queues: new Map(),
  };
  const queues = options.queues ?? {};
  if (typeof queues !== 'object' || queues === null || Array.isArray(queues)) {
    throw fail('handoff.queues', `must be an object of queue name → settings, got ${show(queues)}`);
  }
  for (const [name, settings] of Object.entries(queues)) {
    config.queues.set(name, resolveQueueSettings(name, settings, suggest));
  }
  return config;
}

/** One queue's settings with the defaults, checked; `settings` undefined gives the defaults. */
export function resolveQueueSettings(name: string, settings: unknown, suggest: Suggest): QueueSettings {
  const path = `handoff.queues['${name}']`;
  if (!isQueueName(name)) {
    throw new Error(badHandoffOption(path, 'is not a queue name: use 1 to 100 letters, digits, and _ . - /'));
  }
  const options = (
    settings === undefined ? {} : checkObject(path, settings, QUEUE_LEVEL, suggest)
  ) as HandoffQueueOptions;
  const deadLetter = options.deadLetter ?? defaultDeadLetter(name);
  if (!isQueueName(deadLetter) || deadLetter === name) {
    throw new Error(
      badHandoffOption(
        `${path}.deadLetter`,
        `must be another queue's name (1 to 100 letters, digits, and _ . - /), got ${show(deadLetter)}`,
      ),
    );
  }
  const retryBackoff = options.retryBackoff ?? HANDOFF_DEFAULTS.retryBackoff;
  if (typeof retryBackoff !== 'boolean') {
    throw new Error(badHandoffOption(`${path}.retryBackoff`, `must be a boolean, got ${show(retryBackoff)}`));
  }
  return {
    retryLimit: whole(`${path}.retryLimit`, options.retryLimit, HANDOFF_DEFAULTS.retryLimit, 0, 1_000_000),
    retryDelaySeconds: whole(
      `${path}.retryDelaySeconds`,
      options.retryDelaySeconds,
      HANDOFF_DEFAULTS.retryDelaySeconds,
      0,
      MAX_PG_BOSS_SECONDS,
    ),
    retryBackoff,
    expireInSeconds: whole(
      `${path}.expireInSeconds`,
      options.expireInSeconds,
      HANDOFF_DEFAULTS.expireInSeconds,
      1,
      MAX_PG_BOSS_SECONDS,
    ),
    deadLetter,
  };
}

function checkObject(
  path: string,
  value: unknown,
  known: Record<string, true>,
  suggest: Suggest,
): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new Error(badHandoffOption(path, `must be an object, got ${show(value)}`));
  }
  const names = Object.keys(known);
  const checked: Record<string, unknown> = {};
  for (const [key, entry] of Object.entries(value)) {
    if (!Object.hasOwn(known, key)) {
      const suggestion = suggest(key, names);
      throw new Error(unknownOption(`${path}.${key}`, suggestion ? `${path}.${suggestion}` : undefined));
    }
    // forRootAsync factories spread unset environment values as undefined.
    if (entry !== undefined) checked[key] = entry;
  }
  return checked;
}

function whole(path: string, value: unknown, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new Error(
      badHandoffOption(path, `must be a whole number from ${min} to ${max}, got ${show(value)}`),
    );
  }
  return value;
}

function milliseconds(path: string, value: unknown, fallback: number, min: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !(value >= min) || value > MAX_TIMER_MS) {
    throw new Error(
      badHandoffOption(path, `must be a number of ms from ${min} to ${MAX_TIMER_MS}, got ${show(value)}`),
    );
  }
  return value;
}

function show(value: unknown): string {
  if (typeof value === 'string') return `'${value}'`;
  if (Array.isArray(value)) return 'an array';
  return value === null ? 'null' : typeof value === 'object' ? 'an object' : String(value);
}
