import { IdempotencyError, type IdempotencyErrorCode } from '../idempotency.errors.js';
import { digestsEqual, hmacSha256 } from './signature-crypto.js';
import { headerEmpty, headerMissing, signatureMismatch } from '../idempotency.messages.js';

const headerRepeated = (header: string) => `${header} header is sent more than once`;

/**
 * Why a delivery's signature was refused: `missing` or `malformed` headers are the sender's
 * request being wrong (400); `mismatch` (another secret, changed bytes) and `stale` (outside the
 * timestamp tolerance, either way) are a refused signature (401); `body` is a valid signature
 * over a body that is not the sender's event (empty, not JSON, another content type): 400;
 * `unverifiable`, a body of a content type whose raw bytes Nest does not keep (400);
 * `no_raw_body`, an app that keeps no raw bodies at all (500: a server fault, never the sender's).
 */
export type SignatureFailure =
  'missing' | 'malformed' | 'mismatch' | 'stale' | 'body' | 'unverifiable' | 'no_raw_body';

/** The error code and HTTP status of each kind of refusal. */
const REFUSALS = {
  missing: ['IDEMPOTENCY_SIGNATURE_MALFORMED', 400],
  malformed: ['IDEMPOTENCY_SIGNATURE_MALFORMED', 400],
  mismatch: ['IDEMPOTENCY_SIGNATURE_INVALID', 401],
  stale: ['IDEMPOTENCY_SIGNATURE_INVALID', 401],
  body: ['IDEMPOTENCY_BODY_UNREADABLE', 400],
  unverifiable: ['IDEMPOTENCY_BODY_UNVERIFIABLE', 400],
  no_raw_body: ['IDEMPOTENCY_RAW_BODY_UNAVAILABLE', 500],
} as const satisfies Record<SignatureFailure, readonly [IdempotencyErrorCode, number]>;

/** Every code a signature refusal can have. */
const SIGNATURE_CODES = [...new Set(Object.values(REFUSALS).map(([code]) => code))];

/**
 * A refused webhook signature, thrown by the signature guards (and their pure verifiers) before
 * any claim: nothing is written, `scope` is empty and `key` undefined. One of the library's
 * errors: answered over HTTP as it is (400, 401, or 500 for `no_raw_body`). `header` is the
 * header it is about, as the sender's documentation spells it.
 */
export class WebhookSignatureError extends IdempotencyError {
  static override readonly CODES: readonly IdempotencyErrorCode[] = SIGNATURE_CODES;
  readonly code: IdempotencyErrorCode;

  constructor(
    readonly failure: SignatureFailure,
    readonly header: string,
    message: string,
  ) {
    const [code, status] = REFUSALS[failure];
    super(message, '', undefined, status);
    this.code = code;
  }
}

/**
 * A header's single value. Express and Fastify give a repeated header (other than a few
 * well-known ones) as one comma-joined string, so an array reaches here only from a caller
 * building headers by hand; it is refused rather than guessed at.
 */
export function requireHeader(value: unknown, header: string): string {
  if (value === undefined || value === null) {
    throw new WebhookSignatureError('missing', header, headerMissing(header));
  }
  if (Array.isArray(value)) throw new WebhookSignatureError('malformed', header, headerRepeated(header));
  if (typeof value !== 'string') throw new WebhookSignatureError('malformed', header, headerMissing(header));
  if (value.length === 0) throw new WebhookSignatureError('missing', header, headerEmpty(header));
  return value;
}

/**
 * Throws a mismatch naming `header` unless `received` is the HMAC-SHA256 of the raw body under one
 * of `secrets` (several during a rotation), compared in constant time: the check GitHub's and
 * Shopify's signatures share, which differ only in how the header encodes the digest.
 */
export function requireBodyHmac(
  header: string,
  rawBody: Buffer,
  secrets: readonly string[],
  received: Buffer,
): void {
  if (!secrets.some((secret) => digestsEqual(hmacSha256(secret, rawBody), received))) {
    throw new WebhookSignatureError('mismatch', header, signatureMismatch(header, 'the raw request body'));
  }
}
