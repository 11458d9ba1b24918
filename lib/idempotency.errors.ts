import { HttpException } from '@nestjs/common';
import type { ConflictState } from './core/claim-check.js';
import type { WebhookSignatureError } from './guards/webhook-signature.error.js';

/**
 * Everything the library raises about a delivery, one family on every transport:
 * `IdempotencyService.run()` and `@Idempotent` methods reject with these, `@IdempotentWebhook`
 * answers them over HTTP as they are (each is an HttpException with its status, body and, where
 * a retry is asked for, `Retry-After`), and over microservices as RpcExceptions whose error
 * carries the same `code`. Tell them apart with `isIdempotencyError(error, code?)` (the root
 * entry), `@Catch(IdempotencyError)` in a filter, or `instanceof` one class (also across the
 * package's ESM and CommonJS builds; every class is on the `nest-idempotent-webhooks/errors`
 * entry); a handler's own errors pass through unchanged.
 */

/** Stable identifiers of the errors below, also sent to RPC callers as `code`. */
export type IdempotencyErrorCode =
  | 'IDEMPOTENCY_INVALID_KEY'
  | 'IDEMPOTENCY_INVALID_ORDER'
  | 'IDEMPOTENCY_IN_FLIGHT'
  | 'IDEMPOTENCY_UNAVAILABLE'
  | 'IDEMPOTENCY_TRANSACTION_ABORTED'
  | 'IDEMPOTENCY_PROPAGATION'
  | 'IDEMPOTENCY_SIGNATURE_MALFORMED'
  | 'IDEMPOTENCY_SIGNATURE_INVALID'
  | 'IDEMPOTENCY_BODY_UNREADABLE'
  | 'IDEMPOTENCY_BODY_UNVERIFIABLE'
  | 'IDEMPOTENCY_RAW_BODY_UNAVAILABLE'
  | 'IDEMPOTENCY_KEY_MISSING'
  | 'IDEMPOTENCY_KEY_REUSED'
  | 'IDEMPOTENCY_RESPONSE_NOT_STORED'
  | 'IDEMPOTENCY_OWNER_UNKNOWN'
  | 'IDEMPOTENCY_BODY_UNPARSED';

/**
 * Set on every error the library makes, under a registered symbol. The package ships an ESM and a
 * CommonJS build, and an app can load both (its code through one, a dependency through the
 * other): each has its own classes, so a plain `instanceof` across them would be false. The brand
 * is the same in both, and `instanceof` checks it with the error's code (Symbol.hasInstance).
 */
const BRAND = Symbol.for('nest-idempotent-webhooks/error');

/** The code of a branded error, or undefined for anything else. */
function brandedCode(value: unknown): IdempotencyErrorCode | undefined {
  if (typeof value !== 'object' || value === null) return undefined;
  const branded = value as { [BRAND]?: unknown; code?: unknown };
  return branded[BRAND] === true ? (branded.code as IdempotencyErrorCode) : undefined;
}

/** The class of each code's errors, for isIdempotencyError's narrowing. */
interface ErrorOfCode {
  IDEMPOTENCY_INVALID_KEY: InvalidIdempotencyKeyError;
  IDEMPOTENCY_INVALID_ORDER: InvalidEventOrderError;
  IDEMPOTENCY_IN_FLIGHT: EventInFlightError;
  IDEMPOTENCY_UNAVAILABLE: IdempotencyUnavailableError;
  IDEMPOTENCY_TRANSACTION_ABORTED: TransactionAbortedError;
  IDEMPOTENCY_PROPAGATION: PropagationError;
  IDEMPOTENCY_KEY_MISSING: MissingIdempotencyKeyError;
  IDEMPOTENCY_KEY_REUSED: IdempotencyKeyReusedError;
  IDEMPOTENCY_RESPONSE_NOT_STORED: ResponseNotStoredError;
  IDEMPOTENCY_OWNER_UNKNOWN: IdempotencyOwnerUnknownError;
  IDEMPOTENCY_BODY_UNPARSED: UnparsedRequestBodyError;
  IDEMPOTENCY_SIGNATURE_MALFORMED: WebhookSignatureError;
  IDEMPOTENCY_SIGNATURE_INVALID: WebhookSignatureError;
  IDEMPOTENCY_BODY_UNREADABLE: WebhookSignatureError;
  IDEMPOTENCY_BODY_UNVERIFIABLE: WebhookSignatureError;
  IDEMPOTENCY_RAW_BODY_UNAVAILABLE: WebhookSignatureError;
}

/**
 * True when `error` is one of the library's errors (from either build of the package), and, with
 * `code`, that one, narrowed to its class: after `isIdempotencyError(error, 'IDEMPOTENCY_IN_FLIGHT')`,
 * `error.retryAfterSeconds` is there.
 */
export function isIdempotencyError<C extends IdempotencyErrorCode = IdempotencyErrorCode>(
  error: unknown,
  code?: C,
): error is C extends keyof ErrorOfCode ? ErrorOfCode[C] : IdempotencyError & { readonly code: C } {
  const found = brandedCode(error);
  return found !== undefined && (code === undefined || found === code);
}

/** The reason phrase Nest puts in a body's `error` for these statuses. */
const REASONS: Record<number, string> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  409: 'Conflict',
  415: 'Unsupported Media Type',
  422: 'Unprocessable Content',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
};

/** Base class of every error the library raises about a delivery. */
export abstract class IdempotencyError extends HttpException {
  /** Which of the errors this is, stable across releases. */
  abstract readonly code: IdempotencyErrorCode;
  /** The codes `instanceof` this class matches; undefined on the base class: every code. */
  static readonly CODES: readonly IdempotencyErrorCode[] | undefined;

  /**
   * `error instanceof EventInFlightError` holds for that error made by either build of the
   * package (see BRAND); `instanceof IdempotencyError` for any of them.
   */
  static override [Symbol.hasInstance](value: unknown): boolean {
    const code = brandedCode(value);
    if (code === undefined) return false;
    return this.CODES === undefined || this.CODES.includes(code);
  }

  constructor(
    message: string,
    /** The handler's scope; empty for a signature refused before any claim. */
    readonly scope: string,
    /** The event's key, or undefined when it could not be extracted. */
    readonly key: string | undefined,
    /** The HTTP status this error is answered with. */
    status: number,
    options: { cause?: unknown; reason?: boolean } = {},
  ) {
    // The body Nest answers: `{ statusCode, message }`, with the reason phrase as `error` where the
    // library always gave one, so answers do not change between Nest 11 and 12.
    const body =
      options.reason === false
        ? { statusCode: status, message }
        : { statusCode: status, message, error: REASONS[status] };
    super(body, status, { cause: options.cause });
    Object.defineProperty(this, BRAND, { value: true });
  }

  /** Set by asProblemDetails(): the body is then an RFC 9457 problem details object. */
  private problem?: ProblemDetails;

  /** The key as its client sent it, where the claim's key holds more; see withClientKey(). */
  private clientKey?: string;

  /**
   * Has the answer (asProblemDetails) name `clientKey`, the key as the client sent it, wherever
   * the message names the claim's key, which a request-mode route prefixes with the caller's
   * owner: no answer echoes the owner. `message` and `key` keep the claim's key, for the logs.
   * Called by the HTTP transport; nothing else needs it.
   */
  withClientKey(clientKey: string): this {
    this.clientKey = clientKey;
    return this;
  }

  /**
   * Answers this error as problem details (RFC 9457, `application/problem+json`), as the
   * Idempotency-Key draft shows its refusals: what `@IdempotentRequest` routes answer. Webhook
   * routes keep Nest's `{ statusCode, message, error }`.
   */
  asProblemDetails(): this {
    const { key, clientKey } = this;
    const detail =
      key !== undefined && clientKey !== undefined && clientKey !== key
        ? this.message.replaceAll(key, clientKey)
        : this.message;
    this.problem = problemDetails(this.code, this.getStatus(), detail);
    return this;
  }

  /** The body Nest answers: problem details once asked for (asProblemDetails), else Nest's shape. */
  override getResponse(): string | object {
    return this.problem ?? super.getResponse();
  }
}

/**
 * 400. The key is not usable: the extractor threw or returned something other than a non-empty
 * string of at most `maxKeyLength` characters without NUL or lone surrogates. Nothing was written,
 * and a redelivery of the same event will fail the same way.
 */
export class InvalidIdempotencyKeyError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_INVALID_KEY'] as const;
  readonly code = 'IDEMPOTENCY_INVALID_KEY' as const;

  constructor(message: string, scope: string, key: string | undefined) {
    super(message, scope, key, 400);
  }
}

/**
 * 400. The ordering guard could not read the delivery: its entity or version extractor threw or
 * returned something it cannot compare (see `EventOrderOptions`). Nothing was written, and a
 * redelivery of the same event will fail the same way.
 */
export class InvalidEventOrderError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_INVALID_ORDER'] as const;
  readonly code = 'IDEMPOTENCY_INVALID_ORDER' as const;

  constructor(message: string, scope: string, key: string | undefined) {
    super(message, scope, key, 400);
  }
}

/**
 * 409 (or the module's `inFlightStatus`, 503) + `Retry-After`. Another delivery of the event is
 * being processed right now (a live lease, or a transaction still open after
 * `concurrentDuplicateWaitMs`). Nothing was done; deliver again after `retryAfterSeconds`. Never
 * treat it as success: the other delivery may still fail.
 */
export class EventInFlightError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_IN_FLIGHT'] as const;
  readonly code = 'IDEMPOTENCY_IN_FLIGHT' as const;

  constructor(
    message: string,
    scope: string,
    key: string,
    /** Seconds until a redelivery may find the event free (at least 1). */
    readonly retryAfterSeconds: number,
    /** The HTTP status: the module's `inFlightStatus`. @default 409 */
    status: 409 | 503 = 409,
  ) {
    super(message, scope, key, status, { reason: false });
  }
}

/**
 * 503 + `Retry-After`. The database could not record the claim or its outcome (unreachable,
 * restarting, out of connections, a lost connection mid-handler). Nothing is known to be
 * committed; deliver again after `retryAfterSeconds`: the redelivery is safe either way.
 */
export class IdempotencyUnavailableError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_UNAVAILABLE'] as const;
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
    super(message, scope, key, 503, { cause });
  }
}

/**
 * 500. The handler returned, but a statement of its transaction had failed (and was caught), so
 * PostgreSQL turned the COMMIT into a ROLLBACK: neither the claim nor the handler's writes exist.
 * Deliver again; to recover from an expected error, run that statement in a nested
 * `manager.transaction()`.
 */
export class TransactionAbortedError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_TRANSACTION_ABORTED'] as const;
  readonly code = 'IDEMPOTENCY_TRANSACTION_ABORTED' as const;

  constructor(message: string, scope: string, key: string) {
    super(message, scope, key, 500);
  }
}

/**
 * 500. A claim was made where its `propagation` forbids it: `'never'` inside a delivery,
 * `'mandatory'` outside a transaction-mode one, or an external-mode claim that would have to join
 * a transaction-mode delivery's transaction (a lease must commit at once; ask for
 * `propagation: 'requiresNew'` to claim it on its own connection). Nothing was claimed. A
 * programming error: the same call fails the same way every time.
 */
export class PropagationError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_PROPAGATION'] as const;
  readonly code = 'IDEMPOTENCY_PROPAGATION' as const;

  constructor(
    message: string,
    scope: string,
    key: string,
    /** The scope of the delivery the claim was made in, if any. */
    readonly enclosingScope: string | undefined,
  ) {
    super(message, scope, key, 500);
  }
}

/**
 * 400. A request-mode route (`@IdempotentRequest`, `required: true`) received no `Idempotency-Key`
 * header. Nothing ran and nothing was written: send the request again with a key.
 */
export class MissingIdempotencyKeyError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_KEY_MISSING'] as const;
  readonly code = 'IDEMPOTENCY_KEY_MISSING' as const;

  constructor(message: string, scope: string) {
    super(message, scope, undefined, 400);
  }
}

/**
 * 422. The key was used before for another request (a request-mode route: another method, URL or
 * body) or another event (a webhook with `onKeyConflict: 'refuse'`): its fingerprint differs from
 * the one stored with the claim, which is `state` (done, failed, or in flight). Nothing ran. A
 * client sends the new request under a new key.
 */
export class IdempotencyKeyReusedError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_KEY_REUSED'] as const;
  readonly code = 'IDEMPOTENCY_KEY_REUSED' as const;

  constructor(
    message: string,
    scope: string,
    key: string,
    /** What the key's claim is: done, failed, or in flight. */
    readonly state: ConflictState,
  ) {
    super(message, scope, key, 422);
  }
}

/**
 * 500. A request-mode route returned what cannot be stored for its retries: a body over
 * `maxStoredResponseBytes`, or one that is not JSON (a stream, a Buffer). Transaction mode only
 * (external mode stores the status and headers without the body, as its work has happened): the
 * claim and the handler's writes were rolled back, and a retry runs the handler again. Return a
 * smaller body (a `Location` to read the rest from), or raise the cap.
 */
export class ResponseNotStoredError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_RESPONSE_NOT_STORED'] as const;
  readonly code = 'IDEMPOTENCY_RESPONSE_NOT_STORED' as const;

  constructor(message: string, scope: string, key: string) {
    super(message, scope, key, 500);
  }
}

/**
 * 500. A request-mode route scopes its keys to their owner (`owner`), and the function gave no
 * owner for this request (it threw, or returned nothing: not a non-empty string or a number).
 * Nothing ran. A server fault: refuse unauthenticated requests with a guard, which runs before the
 * claim. An owner of any length is an owner (a long one is hashed in the claim's key).
 */
export class IdempotencyOwnerUnknownError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_OWNER_UNKNOWN'] as const;
  readonly code = 'IDEMPOTENCY_OWNER_UNKNOWN' as const;

  constructor(message: string, scope: string) {
    super(message, scope, undefined, 500);
  }
}

/**
 * 415. A request-mode route fingerprints the bytes of each request (the default `fingerprint`),
 * and this request has a body no parser read: the app parses no such Content-Type (Express parses
 * only JSON and forms unless told; Fastify refuses unknown types itself), or the route reads the
 * stream itself. Nothing ran and nothing was written. Register a parser for the type
 * (`app.useBodyParser()`), or give the route a `fingerprint` of its own.
 */
export class UnparsedRequestBodyError extends IdempotencyError {
  static override readonly CODES = ['IDEMPOTENCY_BODY_UNPARSED'] as const;
  readonly code = 'IDEMPOTENCY_BODY_UNPARSED' as const;

  constructor(
    message: string,
    scope: string,
    /** The request's media type, lower-case, without parameters; empty when it sent none. */
    readonly mediaType: string,
  ) {
    super(message, scope, undefined, 415);
  }
}

/** RFC 9457 problem details, as `@IdempotentRequest` routes answer the library's refusals. */
export interface ProblemDetails {
  /** A URI naming the problem type: the draft, for the key's own problems; else `about:blank`. */
  readonly type: string;
  readonly title: string;
  readonly status: number;
  readonly detail: string;
  /** The error's `code`, for programs. */
  readonly code: IdempotencyErrorCode;
}

/** The Idempotency-Key draft, the documentation the key's problems point at. */
const IDEMPOTENCY_KEY_DRAFT = 'https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/';

/** The draft's titles for the key's own problems; every other problem is `about:blank`. */
const KEY_PROBLEM_TITLES: Partial<Record<IdempotencyErrorCode, string>> = {
  IDEMPOTENCY_KEY_MISSING: 'Idempotency-Key is missing',
  IDEMPOTENCY_INVALID_KEY: 'Idempotency-Key is malformed',
  IDEMPOTENCY_KEY_REUSED: 'Idempotency-Key is already used',
  IDEMPOTENCY_IN_FLIGHT: 'A request is outstanding for this Idempotency-Key',
};

function problemDetails(code: IdempotencyErrorCode, status: number, detail: string): ProblemDetails {
  const title = KEY_PROBLEM_TITLES[code];
  // RFC 9457 4.2.1: with about:blank the title is the status's reason phrase.
  return title
    ? { type: IDEMPOTENCY_KEY_DRAFT, title, status, detail, code }
    : { type: 'about:blank', title: REASONS[status] ?? 'Error', status, detail, code };
}
