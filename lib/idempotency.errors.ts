/**
 * What an idempotent run rejects with, on every transport. `IdempotencyService.run()` and
 * `@Idempotent` methods reject with these; `@IdempotentWebhook` maps them to HTTP exceptions
 * (transports/http/http-exceptions.ts) or to RpcExceptions whose error carries the same `code`.
 * Catch them with `instanceof`; a handler's own errors pass through unchanged.
 */

/** Stable identifiers of the errors below, also sent to RPC callers as `code`. */
export type IdempotencyErrorCode =
  | 'IDEMPOTENCY_INVALID_KEY'
  | 'IDEMPOTENCY_IN_FLIGHT'
  | 'IDEMPOTENCY_UNAVAILABLE'
  | 'IDEMPOTENCY_TRANSACTION_ABORTED';

/** Base class of every error the library raises about a delivery. */
export abstract class IdempotencyError extends Error {
  /** Which of the errors this is, stable across releases. */
  abstract readonly code: IdempotencyErrorCode;

  constructor(
    message: string,
    /** The handler's scope. */
    readonly scope: string,
    /** The event's key, or undefined when it could not be extracted. */
    readonly key: string | undefined,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The key is not usable: the extractor threw or returned something other than a non-empty string
 * of at most `maxKeyLength` characters without NUL or lone surrogates. Nothing was written, and a
 * redelivery of the same event will fail the same way.
 */
export class InvalidIdempotencyKeyError extends IdempotencyError {
  readonly code = 'IDEMPOTENCY_INVALID_KEY' as const;
}

/**
 * Another delivery of the event is being processed right now (a live lease, or a transaction
 * still open after `concurrentDuplicateWaitMs`). Nothing was done; deliver again after
 * `retryAfterSeconds`. Never treat it as success: the other delivery may still fail.
 */
export class EventInFlightError extends IdempotencyError {
  readonly code = 'IDEMPOTENCY_IN_FLIGHT' as const;

  constructor(
    message: string,
    scope: string,
    key: string,
    /** Seconds until a redelivery may find the event free (at least 1). */
    readonly retryAfterSeconds: number,
  ) {
    super(message, scope, key);
  }
}

/**
 * The database could not record the claim or its outcome (unreachable, restarting, out of
 * connections, a lost connection mid-handler). Nothing is known to be committed; deliver again
 * after `retryAfterSeconds`: the redelivery is safe either way.
 */
export class IdempotencyUnavailableError extends IdempotencyError {
  readonly code = 'IDEMPOTENCY_UNAVAILABLE' as const;

  constructor(
    message: string,
    scope: string,
    key: string,
    /** Seconds to wait before delivering again. */
    readonly retryAfterSeconds: number,
    /** SQLSTATE or Node error code of the database error, if it had one. */
    readonly sqlState: string | undefined,
    cause: unknown,
  ) {
    super(message, scope, key, { cause });
  }
}

/**
 * The handler returned, but a statement of its transaction had failed (and was caught), so
 * PostgreSQL turned the COMMIT into a ROLLBACK: neither the claim nor the handler's writes exist.
 * Deliver again; to recover from an expected error, run that statement in a nested
 * `manager.transaction()`.
 */
export class TransactionAbortedError extends IdempotencyError {
  readonly code = 'IDEMPOTENCY_TRANSACTION_ABORTED' as const;
}
