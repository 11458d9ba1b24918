import type { IdempotencyErrorCode } from '../idempotency.errors.js';
import { WebhookSignatureError } from './webhook-signature.error.js';

/**
 * The signature guards' refusals by kind, for exception filters: each matches, with `instanceof`,
 * a WebhookSignatureError of its code (one family with the library's other errors), whichever
 * class made it. They used to be HTTP exceptions wrapping the error; they are the error now,
 * under its kind's name. Thrown by a guard, so before the interceptor: nothing is claimed or written.
 */

/** 400: the signature header is missing or not in the sender's format. */
export class MalformedSignatureException extends WebhookSignatureError {
  static override readonly CODES: readonly IdempotencyErrorCode[] = ['IDEMPOTENCY_SIGNATURE_MALFORMED'];
  constructor(error: WebhookSignatureError) {
    super(error.failure, error.header, error.message);
  }
}

/** 401: the signature does not match the raw body, or its timestamp is outside the tolerance. */
export class InvalidSignatureException extends WebhookSignatureError {
  static override readonly CODES: readonly IdempotencyErrorCode[] = ['IDEMPOTENCY_SIGNATURE_INVALID'];
  constructor(error: WebhookSignatureError) {
    super(error.failure, error.header, error.message);
  }
}

/**
 * 400: the signature is valid, but the signed body is not an event the sender sends: empty, not
 * JSON (the sender's SDK cannot parse it), or parsed by the platform as another content type.
 */
export class UnreadableBodyException extends WebhookSignatureError {
  static override readonly CODES: readonly IdempotencyErrorCode[] = ['IDEMPOTENCY_BODY_UNREADABLE'];
  constructor(error: WebhookSignatureError) {
    super(error.failure, error.header, error.message);
  }
}

/** 400: the request's body is of a content type whose raw bytes Nest does not keep, so it cannot be verified. */
export class UnverifiableBodyException extends WebhookSignatureError {
  static override readonly CODES: readonly IdempotencyErrorCode[] = ['IDEMPOTENCY_BODY_UNVERIFIABLE'];
  constructor(message: string, header = '') {
    super('unverifiable', header, message);
  }
}

/**
 * 500: the server cannot verify any delivery, because the app keeps no raw bodies (`rawBody: true`
 * missing where the boot check could not tell: `bodyParser: false`, or a global guard). A server
 * fault, so never a 401: the sender is not to blame, and retries once it is fixed.
 */
export class RawBodyUnavailableException extends WebhookSignatureError {
  static override readonly CODES: readonly IdempotencyErrorCode[] = ['IDEMPOTENCY_RAW_BODY_UNAVAILABLE'];
  constructor(message: string, header = '') {
    super('no_raw_body', header, message);
  }
}
