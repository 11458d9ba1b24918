import { digestsEqual, hmacSha256 } from './signature-crypto.js';
import { headerEmpty, headerMissing, headerRepeated, signatureMismatch } from '../idempotency.messages.js';

/**
 * Why a delivery's signature was refused: `missing` or `malformed` headers are the sender's
 * request being wrong (400); `mismatch` (another secret, changed bytes) and `stale` (outside the
 * timestamp tolerance, either way) are a refused signature (401); `body` is a valid signature
 * over a body that is not the sender's event (empty, not JSON, another content type): 400.
 */
export type SignatureFailure = 'missing' | 'malformed' | 'mismatch' | 'stale' | 'body';

/**
 * A refused webhook signature, transport-neutral: thrown by the pure verifiers, answered over HTTP
 * by the guards as `MalformedSignatureException` (400), `InvalidSignatureException` (401) or,
 * for a `body` failure, `UnreadableBodyException` (400).
 * `header` is the header it is about, as the sender's documentation spells it.
 */
export class WebhookSignatureError extends Error {
  override name = 'WebhookSignatureError';

  constructor(
    readonly failure: SignatureFailure,
    readonly header: string,
    message: string,
  ) {
    super(message);
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
