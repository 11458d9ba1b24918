import { EventInFlightError, IdempotencyKeyReusedError } from '../idempotency.errors.js';
import { duplicateInFlight } from '../idempotency.messages.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import type { ClaimResult } from './claim-result.js';

/** Answered 422 when a key comes back with another fingerprint than its claim's. */
export const keyReused = (key: string) =>
  `This operation is idempotent and its Idempotency-Key ${key} was already used with another request (another method, URL or body): send a new request under a new key`;

/** A claim result that did not settle: nothing ran, and the caller is answered an error. */
export type RefusedResult = Extract<ClaimResult<unknown>, { kind: 'in_flight' } | { kind: 'conflict' }>;

/** Whether `result` did not settle, and claimRefusal() answers it. */
export function isRefused(result: ClaimResult<unknown>): result is RefusedResult {
  return result.kind === 'in_flight' || result.kind === 'conflict';
}

/**
 * The error a claim that did not settle answers, in one place for every caller (ClaimRunner.run(),
 * the interceptor): an in-flight duplicate is EventInFlightError (`inFlightStatus`, Retry-After),
 * a key refused for another fingerprint IdempotencyKeyReusedError (422). A settled result
 * (processed, replayed, stale) each transport answers its own way. The strategies report these
 * as results, not errors, so that a duplicate storm builds an error only where it is answered.
 */
export function claimRefusal(
  result: RefusedResult,
  scope: string,
  key: string,
  config: Pick<IdempotencyConfig, 'inFlightStatus'>,
): EventInFlightError | IdempotencyKeyReusedError {
  if (result.kind === 'conflict') {
    return new IdempotencyKeyReusedError(keyReused(key), scope, key, result.state);
  }
  return new EventInFlightError(
    duplicateInFlight(key),
    scope,
    key,
    result.retryAfterSeconds,
    config.inFlightStatus,
  );
}
