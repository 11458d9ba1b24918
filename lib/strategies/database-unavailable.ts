import type { Logger } from '@nestjs/common';
import { IdempotencyUnavailableError } from '../idempotency.errors.js';
import { errorCode } from '../postgres/pg-errors.js';

export const databaseUnavailable = (key: string) =>
  `Could not record event ${key}: the database is unavailable; retry later`;

/**
 * Logs a database failure with `log` and wraps it for the answer every transport gives it:
 * deliver again after `retryAfterSeconds` (HTTP 503 + Retry-After), never a 200.
 */
export function databaseUnavailableError(
  logger: Logger,
  log: (code: string | undefined) => string,
  scope: string,
  key: string,
  retryAfterSeconds: number,
  error: unknown,
): IdempotencyUnavailableError {
  const code = errorCode(error);
  logger.error(log(code));
  return new IdempotencyUnavailableError(
    databaseUnavailable(key),
    scope,
    key,
    retryAfterSeconds,
    code,
    error,
  );
}
