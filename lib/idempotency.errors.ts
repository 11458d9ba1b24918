/**
 * What an idempotent run rejects with, on every transport. `IdempotencyService.run()` and
 * `@Idempotent` methods reject with these; `@IdempotentWebhook` maps them to HTTP exceptions
 * (transports/http/http-exceptions.ts) or to RpcExceptions whose error carries the same `code`.
 * Catch them with `instanceof` (or `isIdempotencyError()`); a handler's own errors pass through
 * unchanged.
 */

/** Stable identifiers of the errors below, also sent to RPC callers as `code`. */
export type IdempotencyErrorCode =
  | 'IDEMPOTENCY_INVALID_KEY'
  | 'IDEMPOTENCY_IN_FLIGHT'
  | 'IDEMPOTENCY_UNAVAILABLE'
  | 'IDEMPOTENCY_TRANSACTION_ABORTED'
  | 'IDEMPOTENCY_PROPAGATION';

/**
 * Set on every error the library makes, under a registered symbol. The package ships an ESM and a
 * CommonJS build, and an app can load both (its code through one, a dependency through the
 * other): each has its own classes, so a plain `instanceof` across them would be false. The brand
 * is the same in both, and `instanceof` checks it (Symbol.hasInstance below).
 */
const BRAND = Symbol.for('nest-idempotent-webhooks/error');

/** The code of a branded error, or undefined for anything else. */
function brandedCode(value: unknown): IdempotencyErrorCode | undefined {
  if (typeof value !== 'object' || value === null) return undefined;
  const branded = value as { [BRAND]?: unknown; code?: unknown };
  return branded[BRAND] === true ? (branded.code as IdempotencyErrorCode) : undefined;
}

/**
 * True when `error` is one of the library's errors (from either build of the package), and, with
 * `code`, that one: `isIdempotencyError(error, 'IDEMPOTENCY_IN_FLIGHT')`.
 */
export function isIdempotencyError<C extends IdempotencyErrorCode>(
  error: unknown,
  code?: C,
): error is IdempotencyError & { readonly code: C } {
  const found = brandedCode(error);
  return found !== undefined && (code === undefined || found === code);
}

/** Base class of every error the library raises about a delivery. */
export abstract class IdempotencyError extends Error {
  /** Which of the errors this is, stable across releases. */
  abstract readonly code: IdempotencyErrorCode;
  /** The code of the class's errors; undefined on this base class. */
  static readonly CODE: IdempotencyErrorCode | undefined;

  /**
   * `error instanceof EventInFlightError` holds for that error made by either build of the
   * package (see BRAND); `instanceof IdempotencyError` for any of them.
   */
  static override [Symbol.hasInstance](value: unknown): boolean {
    const code = brandedCode(value);
    if (code === undefined) return false;
    return this.CODE === undefined || this.CODE === code;
  }

  declare readonly [BRAND]: true;

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
    Object.defineProperty(this, BRAND, { value: true });
  }
}

/**
 * The key is not usable: the extractor threw or returned something other than a non-empty string
 * of at most `maxKeyLength` characters without NUL or lone surrogates. Nothing was written, and a
 * redelivery of the same event will fail the same way.
 */
export class InvalidIdempotencyKeyError extends IdempotencyError {
  static override readonly CODE = 'IDEMPOTENCY_INVALID_KEY';
  readonly code = 'IDEMPOTENCY_INVALID_KEY' as const;
}

/**
 * Another delivery of the event is being processed right now (a live lease, or a transaction
 * still open after `concurrentDuplicateWaitMs`). Nothing was done; deliver again after
 * `retryAfterSeconds`. Never treat it as success: the other delivery may still fail.
 */
export class EventInFlightError extends IdempotencyError {
  static override readonly CODE = 'IDEMPOTENCY_IN_FLIGHT';
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
  static override readonly CODE = 'IDEMPOTENCY_UNAVAILABLE';
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
  static override readonly CODE = 'IDEMPOTENCY_TRANSACTION_ABORTED';
  readonly code = 'IDEMPOTENCY_TRANSACTION_ABORTED' as const;
}

/**
 * A claim was made where its `propagation` forbids it: `'never'` inside a delivery, `'mandatory'`
 * outside a transaction-mode one, or an external-mode claim that would have to join a
 * transaction-mode delivery's transaction (a lease must commit at once; ask for
 * `propagation: 'requiresNew'` to claim it on its own connection). Nothing was claimed. A
 * programming error: the same call fails the same way every time.
 */
export class PropagationError extends IdempotencyError {
  static override readonly CODE = 'IDEMPOTENCY_PROPAGATION';
  readonly code = 'IDEMPOTENCY_PROPAGATION' as const;

  constructor(
    message: string,
    scope: string,
    key: string,
    /** The scope of the delivery the claim was made in, if any. */
    readonly enclosingScope: string | undefined,
  ) {
    super(message, scope, key);
  }
}
