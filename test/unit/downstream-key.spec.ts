import { createHash } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import {
  DOWNSTREAM_KEY_HASH_PREFIX,
  downstreamKeyOf,
  MAX_PLAIN_DOWNSTREAM_KEY,
} from '../../lib/core/downstream-key.js';

/** The hashed form, computed here on its own: `sha256-` and the base64url SHA-256 of the UTF-8 bytes. */
const hashed = (key: string) =>
  `sha256-${createHash('sha256').update(Buffer.from(key, 'utf8')).digest('base64url')}`;

/** What an HTTP header value can carry as every client and API takes it: visible ASCII only. */
const HEADER_SAFE = /^[\x21-\x7e]+$/;

/** Whether Node's own header check (the one fetch and http.request apply) takes `value`. */
function nodeTakes(value: string): boolean {
  try {
    new Headers({ 'idempotency-key': value });
    return true;
  } catch {
    return false;
  }
}

/** A well-formed code point of any width: ASCII, controls, Latin-1, the BMP, astral. */
const anyCodePoint = fc
  .oneof(
    fc.integer({ min: 0x00, max: 0x7f }),
    fc.integer({ min: 0x80, max: 0xff }),
    fc.integer({ min: 0x100, max: 0xd7ff }),
    fc.integer({ min: 0xe000, max: 0xffff }),
    fc.integer({ min: 0x10000, max: 0x10ffff }),
  )
  .map((point) => String.fromCodePoint(point));
const anyKey = fc.string({ unit: anyCodePoint, minLength: 1, maxLength: 300 });
/** Keys sent as they are: visible ASCII, 1..255 characters, not starting with the prefix. */
const plainKey = fc
  .string({
    unit: fc.integer({ min: 0x21, max: 0x7e }).map((c) => String.fromCharCode(c)),
    minLength: 1,
    maxLength: 255,
  })
  .filter((key) => !key.startsWith(DOWNSTREAM_KEY_HASH_PREFIX));

describe('downstreamKeyOf', () => {
  it.each([
    ['a Stripe event id', 'evt_1NXWPnHIKdBQ9Vt9q0J3zJqC'],
    ['a GitHub delivery id', '72d3162e-cc78-11e3-81ab-4c9367dc0958'],
    ['a request-mode key with its owner', 'user_42:8e03978e-40d5-43e8-bc93-6894a57f9324'],
    ['punctuation', '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~'],
    ['255 characters', 'k'.repeat(MAX_PLAIN_DOWNSTREAM_KEY)],
    ['one character', 'k'],
    ['the prefix in another case', 'SHA256-abc'],
  ])('sends %s as it is', (_what, key) => {
    expect(downstreamKeyOf(key)).toBe(key);
  });

  it.each([
    ['a character above U+00FF', 'evt_ā'],
    ['Latin-1', 'évènement'],
    ['emoji', 'evt_😀'],
    ['a space', 'evt 1'],
    ['a newline', 'evt\n1'],
    ['a control character', 'evt\u0085'],
    ['256 characters', 'k'.repeat(MAX_PLAIN_DOWNSTREAM_KEY + 1)],
    ['the prefix itself', 'sha256-'],
    ['what looks like a hashed form already', hashed('evt_ā')],
  ])('hashes a key with %s: sha256- and 43 base64url characters', (_what, key) => {
    const form = downstreamKeyOf(key);
    expect(form).toBe(hashed(key));
    expect(form).toMatch(/^sha256-[A-Za-z0-9_-]{43}$/);
  });

  it('never lets a raw key pass for the hashed form of another', () => {
    const form = downstreamKeyOf('evt_ā');
    // Someone sends that hashed form as a key of their own: it is hashed again, not passed on.
    expect(downstreamKeyOf(form)).not.toBe(form);
  });

  it('property: header-safe for any key, taken by fetch, and at most 255 characters', () => {
    fc.assert(
      fc.property(anyKey, (key) => {
        const form = downstreamKeyOf(key);
        expect(form).toMatch(HEADER_SAFE);
        expect(form.length).toBeLessThanOrEqual(MAX_PLAIN_DOWNSTREAM_KEY);
        expect(nodeTakes(form)).toBe(true);
      }),
      { numRuns: 2000 },
    );
  });

  it('property: the same key gives the same form, every time (no salt, no clock)', () => {
    fc.assert(
      fc.property(anyKey, (key) => {
        expect(downstreamKeyOf(key)).toBe(downstreamKeyOf(key));
        expect(downstreamKeyOf(key)).toBe(
          key.length <= 255 && HEADER_SAFE.test(key) && !key.startsWith('sha256-') ? key : hashed(key),
        );
      }),
      { numRuns: 1000 },
    );
  });

  it('property: injective on keys sent as they are, and none of them equals a hashed form', () => {
    fc.assert(
      fc.property(plainKey, plainKey, anyKey, (a, b, other) => {
        expect(downstreamKeyOf(a)).toBe(a);
        if (a !== b) expect(downstreamKeyOf(a)).not.toBe(downstreamKeyOf(b));
        if (downstreamKeyOf(other) !== other) expect(downstreamKeyOf(other)).not.toBe(downstreamKeyOf(a));
      }),
      { numRuns: 2000 },
    );
  });

  it('property: distinct keys give distinct forms (no collision among thousands of hashed and plain keys)', () => {
    const seen = new Map<string, string>();
    fc.assert(
      fc.property(anyKey, (key) => {
        const form = downstreamKeyOf(key);
        const before = seen.get(form);
        if (before !== undefined) expect(before).toBe(key);
        seen.set(form, key);
      }),
      { numRuns: 3000 },
    );
  });
});
