import { createHmac, timingSafeEqual } from 'node:crypto';

/** HMAC-SHA256 of `parts` concatenated, as bytes. */
export function hmacSha256(key: string | Buffer, ...parts: (string | Buffer)[]): Buffer {
  const hmac = createHmac('sha256', key);
  for (const part of parts) hmac.update(part);
  return hmac.digest();
}

/**
 * Whether two digests are equal, in time that does not depend on where they differ (a plain
 * comparison stops at the first differing byte, which lets an attacker guess a signature byte by
 * byte). Lengths are compared first: `timingSafeEqual` throws on unequal lengths, and a digest's
 * length is public anyway.
 */
export function digestsEqual(expected: Buffer, received: Buffer): boolean {
  return expected.length === received.length && timingSafeEqual(expected, received);
}

/** Standard base64 with optional padding; Node's decoder would silently skip any other character. */
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

/** The bytes of a base64 string, or undefined if it is not base64. */
export function decodeBase64(value: string): Buffer | undefined {
  if (!BASE64.test(value) || value.length % 4 === 1) return undefined;
  return Buffer.from(value, 'base64');
}
