import { InvalidEventOrderError } from '../idempotency.errors.js';
import { badClaimOption, claimOptionType, describeError } from '../idempotency.messages.js';
import type { EventOrderExtractor, EventOrderOptions } from '../interfaces/index.js';
import type { ClaimSpec } from './claim-strategy.js';
import { closest } from './closest-name.js';
import { MAX_CLAIM_KEY_BYTES } from './idempotency-key.js';

/** A handler's ordering guard, checked and resolved once, when the decorator is applied. */
export interface EventOrderSpec {
  /** Versions are kept per (scope, entity). */
  readonly scope: string;
  readonly entity: EventOrderExtractor;
  readonly version: EventOrderExtractor;
  /** Whether an event whose version equals the applied one is applied or stale. */
  readonly equalVersions: 'apply' | 'stale';
  /** Whether a stale event's handler runs (with `context.stale`). */
  readonly runStale: boolean;
}

/** One delivery's place in its entity's order: what its claim checks and advances. */
export interface EventOrder {
  readonly spec: EventOrderSpec;
  /** The entity, checked like a key. */
  readonly entity: string;
  /** The version as a decimal literal that PostgreSQL's `numeric` reads exactly. */
  readonly version: string;
}

/** An extractor, called with whatever arguments the transport reads the key from. */
type Extractor = (...args: readonly unknown[]) => unknown;

/** Every option of `order`; the Record type makes an option not listed here a compile error. */
const ORDER_OPTIONS: Record<keyof EventOrderOptions, true> = {
  entity: true,
  version: true,
  scope: true,
  equalVersions: true,
  runStale: true,
};

const EQUAL_VERSIONS = ['apply', 'stale'] as const;

/** The versions table's scope column is varchar(255), as the claims table's. */
const MAX_SCOPE_LENGTH = 255;

/**
 * A version string: an optional minus, digits, an optional fraction. Exponents are left out: one
 * such as 1e200000 is more than `numeric` holds, and would fail the claim instead of the request.
 */
const DECIMAL = /^-?\d+(?:\.\d+)?$/;
/** Longer than any real version (a nanosecond timestamp has 19 digits); bounds what is stored. */
const MAX_VERSION_LENGTH = 100;

const orderNotObject = () =>
  `order must be an object with entity and version functions, e.g. { entity: (event) => event.data.object.id, version: (event) => event.created }`;

const orderOptionUnknown = (name: string, suggestion: string | undefined) =>
  `order has no option ${name}${suggestion ? `; did you mean ${suggestion}?` : ''}`;

/** The ordering guard on an external-mode handler: refused, with what to do instead. */
export const orderNeedsTransactionMode = () =>
  `order needs transaction mode: the version check and its advance are part of the claim's ` +
  `transaction, which external mode does not hold, so two events of one entity could run their ` +
  `side effects at once or out of order. Apply the event in transaction mode and hand the side ` +
  `effect to a worker that reads the state it acts on (IdempotencyContext.enqueue()), or remove order`;

/** InvalidEventOrderError: the entity extractor threw. */
export const entityExtractorThrew = (scope: string, error: unknown) =>
  `Event entity extractor of ${scope} threw: ${describeError(error)}`;

/** InvalidEventOrderError: the version extractor threw. */
export const versionExtractorThrew = (scope: string, error: unknown) =>
  `Event version extractor of ${scope} threw: ${describeError(error)}`;

/** InvalidEventOrderError: the entity is not one the versions table can key. */
export const entityUnusable = (scope: string, what: string) =>
  `Event entity of ${scope} ${what}; it must be a non-empty string or a whole number (null leaves the event unordered)`;

/** InvalidEventOrderError: the version is not one the guard can compare. */
export const versionUnusable = (scope: string, what: string) =>
  `Event version of ${scope} ${what}; it must be a finite number, a bigint, a decimal string such as '1718000000.5', or a valid Date`;

/**
 * Checks `@IdempotentWebhook`'s `order` option and resolves it. A mistake is a TypeError naming
 * `where`, thrown when the decorator is evaluated, as the claim options' are. External mode is
 * refused here: it holds no transaction for the version check to be part of.
 */
export function resolveEventOrder(where: string, options: unknown, claim: ClaimSpec): EventOrderSpec {
  const fail = (detail: string) => new TypeError(badClaimOption(where, detail));
  if (typeof options !== 'object' || options === null) throw fail(orderNotObject());
  const given = options as Partial<EventOrderOptions>;
  const known = Object.keys(ORDER_OPTIONS);
  for (const name of Object.keys(given)) {
    if (!known.includes(name)) throw fail(orderOptionUnknown(name, closest(name, known)));
  }
  if (typeof given.entity !== 'function' || typeof given.version !== 'function') throw fail(orderNotObject());
  const scope = given.scope ?? claim.scope;
  if (typeof scope !== 'string' || scope.length === 0 || [...scope].length > MAX_SCOPE_LENGTH) {
    throw fail(
      claimOptionType('order.scope', `a non-empty string of at most ${MAX_SCOPE_LENGTH} characters`),
    );
  }
  const equalVersions = given.equalVersions ?? 'apply';
  if (!EQUAL_VERSIONS.includes(equalVersions)) {
    throw fail(claimOptionType('order.equalVersions', `'apply' or 'stale', got ${String(equalVersions)}`));
  }
  if (given.runStale !== undefined && typeof given.runStale !== 'boolean') {
    throw fail(claimOptionType('order.runStale', 'a boolean'));
  }
  if (claim.mode !== 'transaction') throw fail(orderNeedsTransactionMode());
  return {
    scope,
    entity: given.entity,
    version: given.version,
    equalVersions,
    runStale: given.runStale ?? false,
  };
}

/**
 * Reads one delivery's entity and version with the extractors' arguments (the key's). Undefined
 * when the entity is null: the event is not ordered. A throw, or a value that cannot be compared,
 * is InvalidEventOrderError (400): nothing is written.
 */
export function extractEventOrder(
  claimScope: string,
  key: string,
  spec: EventOrderSpec,
  args: readonly unknown[],
  maxLength: number,
): EventOrder | undefined {
  let entity: unknown;
  try {
    entity = (spec.entity as Extractor)(...args);
  } catch (error) {
    throw invalid(claimScope, key, entityExtractorThrew(claimScope, error));
  }
  if (entity === null) return undefined;
  let version: unknown;
  try {
    version = (spec.version as Extractor)(...args);
  } catch (error) {
    throw invalid(claimScope, key, versionExtractorThrew(claimScope, error));
  }
  return {
    spec,
    entity: checkEntity(claimScope, key, spec.scope, entity, maxLength),
    version: eventVersion(claimScope, key, version),
  };
}

/**
 * The entity as stored: a string with the key's rules (not empty, at most `maxLength`
 * characters, no NUL, no lone surrogate, small enough for the versions table's index with its
 * scope), or a whole number as its decimal string.
 */
function checkEntity(
  claimScope: string,
  key: string,
  scope: string,
  entity: unknown,
  maxLength: number,
): string {
  let text: string;
  if (typeof entity === 'string') text = entity;
  else if (typeof entity === 'bigint' || (typeof entity === 'number' && Number.isSafeInteger(entity)))
    text = String(entity);
  else throw invalid(claimScope, key, entityUnusable(claimScope, `is ${describeValue(entity)}`));
  if (text.length === 0) throw invalid(claimScope, key, entityUnusable(claimScope, 'is empty'));
  if (text.length > maxLength) {
    throw invalid(
      claimScope,
      key,
      entityUnusable(claimScope, `is ${text.length} characters long (at most ${maxLength})`),
    );
  }
  if (text.includes('\u0000'))
    throw invalid(claimScope, key, entityUnusable(claimScope, 'contains a NUL character'));
  if (!isWellFormed(text))
    throw invalid(claimScope, key, entityUnusable(claimScope, 'contains a lone UTF-16 surrogate'));
  if (Buffer.byteLength(scope) + Buffer.byteLength(text) > MAX_CLAIM_KEY_BYTES) {
    throw invalid(claimScope, key, entityUnusable(claimScope, `is too long for the versions table's index`));
  }
  return text;
}

/** `version` as a decimal literal that compares as the value it stands for. */
export function eventVersion(claimScope: string, key: string | undefined, version: unknown): string {
  switch (typeof version) {
    case 'number':
      if (!Number.isFinite(version))
        throw invalid(claimScope, key, versionUnusable(claimScope, `is ${version}`));
      // String() writes 1e+21 for large numbers: numeric reads that exactly too.
      return String(version);
    case 'bigint':
      return String(version);
    case 'string':
      if (version.length > MAX_VERSION_LENGTH) {
        throw invalid(claimScope, key, versionUnusable(claimScope, `is ${version.length} characters long`));
      }
      if (!DECIMAL.test(version)) {
        throw invalid(
          claimScope,
          key,
          versionUnusable(claimScope, `is the string ${JSON.stringify(version.slice(0, 40))}`),
        );
      }
      return version;
  }
  if (version instanceof Date) {
    const ms = version.getTime();
    if (Number.isNaN(ms)) throw invalid(claimScope, key, versionUnusable(claimScope, 'is an invalid Date'));
    return String(ms);
  }
  throw invalid(claimScope, key, versionUnusable(claimScope, `is ${describeValue(version)}`));
}

/** What a value is, for a message: its type, without its content. */
function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (value === undefined) return 'undefined';
  if (typeof value === 'number') return `the number ${value}`;
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : `a ${typeof value}`;
}

/** No UTF-16 surrogate without its pair (String.prototype.isWellFormed is ES2024). */
function isWellFormed(text: string): boolean {
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(text);
}

function invalid(scope: string, key: string | undefined, message: string): InvalidEventOrderError {
  return new InvalidEventOrderError(message, scope, key);
}
