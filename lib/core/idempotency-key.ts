import { InvalidIdempotencyKeyError } from '../idempotency.errors.js';
import {
  keyEmpty,
  keyExtractorThrew,
  keyHasNul,
  keyNotString,
  keyNotWellFormed,
  keyTooLong,
} from '../idempotency.messages.js';

/** A UTF-16 surrogate without its pair (String.prototype.isWellFormed is ES2024). */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * The key, if it can be stored as given: a non-empty string of at most `maxLength` characters,
 * without NUL (PostgreSQL text cannot hold it: the insert would fail, and a refused claim is a
 * 503 the sender retries forever) and without lone surrogates (stored as UTF-8 they become
 * U+FFFD and collide). Every transport checks keys here; a rejection writes nothing.
 */
export function checkIdempotencyKey(scope: string, key: unknown, maxLength: number): string {
  if (typeof key !== 'string') throw invalid(scope, keyNotString(scope, key));
  if (key.length === 0) throw invalid(scope, keyEmpty(scope));
  if (key.length > maxLength) throw invalid(scope, keyTooLong(scope, key.length, maxLength));
  if (key.includes('\u0000')) throw invalid(scope, keyHasNul(scope));
  if (LONE_SURROGATE.test(key)) throw invalid(scope, keyNotWellFormed(scope));
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
