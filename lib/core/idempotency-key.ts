import { InvalidIdempotencyKeyError } from '../idempotency.errors.js';
import { describeError } from '../idempotency.messages.js';

export const keyExtractorThrew = (scope: string, error: unknown) =>
  `Idempotency key extractor of ${scope} threw: ${describeError(error)}`;

export const keyNotString = (scope: string, value: unknown) =>
  `Idempotency key of ${scope} must be a string, got ${value === null ? 'null' : typeof value}`;

export const keyEmpty = (scope: string) => `Idempotency key of ${scope} is empty`;

export const keyHasNul = (scope: string) =>
  `Idempotency key of ${scope} contains a NUL character, which PostgreSQL text cannot store`;

export const keyHasControl = (scope: string, character: string, index: number) =>
  `Idempotency key of ${scope} contains the control character ${codePoint(character)} (at index ${index}), which no HTTP header carries intact: such a key could not be sent downstream`;

/** `U+000A`: how a message names a character. */
const codePoint = (character: string) =>
  `U+${character.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}`;

export const keyNotWellFormed = (scope: string) =>
  `Idempotency key of ${scope} contains a lone UTF-16 surrogate; stored as UTF-8 it would become U+FFFD and collide with other keys`;

export const keyTooLong = (scope: string, length: number, max: number) =>
  `Idempotency key of ${scope} is ${length} characters long; the maximum is ${max}`;

export const keyTooManyBytes = (scope: string, keyBytes: number, scopeBytes: number, max: number) =>
  `Idempotency key of ${scope} is ${keyBytes} bytes in UTF-8; with its scope's ${scopeBytes} that is more than the ${max} bytes PostgreSQL's index on the claims table can hold`;

/**
 * A control character other than NUL (refused first, for its own reason): C0 (tab, newline,
 * carriage return...), DEL and C1 (U+0080-U+009F). No HTTP header carries one intact: fetch
 * refuses CR and LF, a tab is whitespace either end may trim, and DEL and C1 are no field
 * characters of RFC 9110. A handler that sends such a key downstream as an Idempotency-Key would
 * fail, or be seen under another key, on every attempt, after the delivery was acknowledged.
 */
const CONTROL = /[\u0001-\u001F\u007F-\u009F]/; // eslint-disable-line no-control-regex -- matching them is the point

/** A UTF-16 surrogate without its pair (String.prototype.isWellFormed is ES2024). */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * The most UTF-8 bytes a claim's scope and key may take together. The claims table's primary key
 * is a btree on (scope, event_key), and PostgreSQL refuses an index entry over 2704 bytes (with
 * 8 kB pages): an incompressible scope and key of about 2687 bytes together is the most an insert
 * takes. Refused there, the claim would be a 503 the sender retries forever; this bound keeps a
 * margin below it, and does not depend on how well a key happens to compress.
 */
export const MAX_CLAIM_KEY_BYTES = 2600;

/**
 * The key, if it can be stored as given: a non-empty string of at most `maxLength` characters,
 * without NUL (PostgreSQL text cannot hold it: the insert would fail, and a refused claim is a
 * 503 the sender retries forever) or any other control character (C0, DEL, C1: no HTTP header can
 * carry one intact, so a handler sending the key downstream would fail on every attempt; other
 * keys that are not visible ASCII travel as IdempotencyContext.downstreamKey), without lone
 * surrogates (stored as UTF-8 they become U+FFFD and collide), and small enough for the claims table's index with its scope (MAX_CLAIM_KEY_BYTES;
 * only a `maxKeyLength` raised above the default lets a key get there). Every transport checks
 * keys here; a rejection writes nothing.
 */
export function checkIdempotencyKey(scope: string, key: unknown, maxLength: number): string {
  if (typeof key !== 'string') throw invalid(scope, keyNotString(scope, key));
  if (key.length === 0) throw invalid(scope, keyEmpty(scope));
  if (key.length > maxLength) throw invalid(scope, keyTooLong(scope, key.length, maxLength));
  if (key.includes('\u0000')) throw invalid(scope, keyHasNul(scope));
  const control = CONTROL.exec(key);
  if (control) throw invalid(scope, keyHasControl(scope, control[0], control.index));
  if (LONE_SURROGATE.test(key)) throw invalid(scope, keyNotWellFormed(scope));
  // A UTF-16 code unit is at most 3 bytes of UTF-8: short keys (every key under the default
  // maxKeyLength) fit without counting.
  if ((scope.length + key.length) * 3 > MAX_CLAIM_KEY_BYTES) {
    const keyBytes = Buffer.byteLength(key, 'utf8');
    const scopeBytes = Buffer.byteLength(scope, 'utf8');
    if (scopeBytes + keyBytes > MAX_CLAIM_KEY_BYTES) {
      throw invalid(scope, keyTooManyBytes(scope, keyBytes, scopeBytes, MAX_CLAIM_KEY_BYTES));
    }
  }
  return key;
}

/** Runs a key extractor and checks what it returns; an extractor that throws is a bad key too. */
export function extractIdempotencyKey(
  scope: string,
  extract: (...args: any[]) => unknown,
  args: readonly unknown[],
  maxLength: number,
): string {
  let key: unknown;
  try {
    key = extract(...args);
  } catch (error) {
    throw invalid(scope, keyExtractorThrew(scope, error));
  }
  return checkIdempotencyKey(scope, key, maxLength);
}

function invalid(scope: string, message: string): InvalidIdempotencyKeyError {
  return new InvalidIdempotencyKeyError(message, scope, undefined);
}
