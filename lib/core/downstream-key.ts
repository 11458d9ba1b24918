import { createHash } from 'node:crypto';

/**
 * What starts every hashed form. A key that itself starts with it is hashed too, so a raw key
 * can never be taken for the hash of another.
 */
export const DOWNSTREAM_KEY_HASH_PREFIX = 'sha256-';

/**
 * The longest key sent as it is: what APIs that take an Idempotency-Key accept (Stripe's limit
 * is 255). The hashed form is 50 characters.
 */
export const MAX_PLAIN_DOWNSTREAM_KEY = 255;

/** Visible ASCII (0x21-0x7E) only: what every HTTP header value, and every API's key check, takes. */
const PLAIN = /^[\x21-\x7e]+$/;

/**
 * `key` in a form any HTTP header value can carry, the same for the same key on every attempt
 * and in every process: the key itself when it is visible ASCII (0x21-0x7E), at most 255
 * characters and does not start with `sha256-`; otherwise `sha256-` and the base64url SHA-256 of
 * its UTF-8 bytes (50 characters). Two keys sent as they are differ as the keys do; a hashed key
 * never equals one sent as it is (the prefix), nor, but by a SHA-256 collision, another hashed one.
 */
export function downstreamKeyOf(key: string): string {
  if (
    key.length <= MAX_PLAIN_DOWNSTREAM_KEY &&
    PLAIN.test(key) &&
    !key.startsWith(DOWNSTREAM_KEY_HASH_PREFIX)
  ) {
    return key;
  }
  return DOWNSTREAM_KEY_HASH_PREFIX + createHash('sha256').update(key, 'utf8').digest('base64url');
}
