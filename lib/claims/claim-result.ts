import type { Logger } from '@nestjs/common';
import { claimFailedLog } from '../idempotency.messages.js';

/** What a claim strategy tells the interceptor; the interceptor only maps it to HTTP. */
export type ClaimResult<T> =
  { kind: 'processed'; value: T } | { kind: 'replayed' } | { kind: 'in_flight'; retryAfterSeconds: number };

/**
 * The claim could not be recorded for infrastructure reasons (database down, pool exhausted,
 * commit failed). Answered 503 with Retry-After: the sender must try again, never a 200.
 */
export class ClaimUnavailableError extends Error {
  constructor(
    readonly key: string,
    readonly sqlState: string | undefined,
    override readonly cause: unknown,
  ) {
    super(`claim of ${key} unavailable (SQLSTATE ${sqlState ?? 'none'})`);
    this.name = 'ClaimUnavailableError';
  }
}

/**
 * The handler returned, but a statement in its transaction had failed (and was caught), so
 * Postgres turned the COMMIT into a ROLLBACK: neither the claim nor the handler's writes exist.
 * Answered 500, never 200: the sender must deliver again.
 */
export class TransactionAbortedError extends Error {
  constructor() {
    super('the COMMIT was rolled back: a statement in the transaction failed and the handler went on');
    this.name = 'TransactionAbortedError';
  }
}

/** SQLSTATE (or Node error code) of a driver error, if any. */
export function errorCode(error: unknown): string | undefined {
  if (typeof error !== 'object' || error === null) return undefined;
  const withCode = error as { code?: unknown; driverError?: { code?: unknown } };
  const code = withCode.code ?? withCode.driverError?.code;
  return typeof code === 'string' ? code : undefined;
}

/** EXECUTE of a name the connection no longer has (someone ran DEALLOCATE or DISCARD on it). */
export const UNKNOWN_PREPARED_STATEMENT = '26000';

/** lock_timeout ran out (55P03): another delivery holds the claim. */
export const LOCK_NOT_AVAILABLE = '55P03';

/** Serialization failure or deadlock: safe to re-run the whole claim in a fresh transaction. */
export const RETRYABLE_CODES = new Set(['40001', '40P01']);

/** Logs a claim or commit the database refused and wraps it for the 503 answer. */
export function claimUnavailable(
  logger: Logger,
  scope: string,
  key: string,
  error: unknown,
): ClaimUnavailableError {
  const code = errorCode(error);
  logger.error(claimFailedLog(scope, key, code, error));
  return new ClaimUnavailableError(key, code, error);
}
