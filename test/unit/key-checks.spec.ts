import { createHash } from 'node:crypto';
import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { parseItem } from 'structured-headers';
import { fingerprintsConflict } from '../../lib/core/claim-check.js';
import { UnstableKeys } from '../../lib/core/unstable-keys.js';
import { stripeEventKey } from '../../lib/index.js';
import { sha256Hex, webhookFingerprint } from '../../lib/keys/webhook-fingerprints.js';
import {
  requestFingerprint,
  requestIdempotencyKey,
  type RequestMode,
} from '../../lib/transports/http/request-mode.js';

const MODE: RequestMode = { required: true, strictKeySyntax: false, replayHeaders: ['location'] };
const STRICT: RequestMode = { ...MODE, strictKeySyntax: true };
const keyOf = (header: string | undefined, mode: RequestMode = MODE) =>
  requestIdempotencyKey(
    'Refunds.create',
    mode,
    { headers: header === undefined ? {} : { 'idempotency-key': header } },
    255,
  );

describe('key checks', () => {
  it('reads the Idempotency-Key header as an sf-string, parameters ignored, or a bare key, and refuses anything else', () => {
    expect(keyOf('"8e03978e-40d5"')).toBe('8e03978e-40d5');
    expect(keyOf('"a \\"quoted\\" key"')).toBe('a "quoted" key');
    expect(keyOf('"8e03978e";v=1')).toBe('8e03978e');
    expect(keyOf('8e03978e-40d5')).toBe('8e03978e-40d5');
    expect(keyOf('token')).toBe('token');
    expect(() => keyOf('"a", "b"')).toThrow('must be a quoted string');
    expect(() => keyOf('a, b')).toThrow('or a bare key');
    // strictKeySyntax: the draft's syntax only.
    expect(() => keyOf('8e03978e-40d5', STRICT)).toThrow('must be a quoted string');
    expect(() => keyOf('token', STRICT)).toThrow('must be a quoted string');
    expect(keyOf('"token"', STRICT)).toBe('token');
    expect(() => keyOf('""')).toThrow('is empty');
    expect(() => keyOf(undefined)).toThrow('requires an Idempotency-Key header');
    expect(keyOf(undefined, { ...MODE, required: false })).toBeUndefined();
  });

  it('reads every header as structured-headers does, quoted strings and anything else; a bare key as itself', () => {
    // Strict: a header the parser reads as a string gives that string; one it refuses, or reads
    // as another item, is refused: the plain-string fast path must never answer otherwise. By
    // default a header that is no sf-string but a bare key (visible ASCII without space, double
    // quote or comma) is that key, and any other is refused.
    const parsed = (header: string) => {
      try {
        const [value] = parseItem(header);
        return typeof value === 'string' && value.length > 0 ? value : undefined;
      } catch {
        return undefined;
      }
    };
    const read = (header: string, mode: RequestMode) => {
      try {
        return keyOf(header, mode);
      } catch {
        return undefined;
      }
    };
    const bare = (header: string) => (/^[\x21\x23-\x2b\x2d-\x7e]+$/.test(header) ? header : undefined);
    const unit = fc.oneof(
      fc.constantFrom('"', '\\', ';', ',', ' ', '=', '%', '*', 'a', '0', '\u007f', '\u0019', '\u00e9'),
      fc.integer({ min: 0x20, max: 0x7e }).map((code) => String.fromCharCode(code)),
    );
    const inner = fc.array(unit, { maxLength: 24 }).map((units) => units.join(''));
    const header = fc.oneof(
      inner.map((text) => `"${text}"`),
      fc.tuple(inner, inner).map(([text, rest]) => `"${text}"${rest}`),
      inner,
    );
    fc.assert(
      fc.property(
        header,
        (value) =>
          read(value, STRICT) === parsed(value) && read(value, MODE) === (parsed(value) ?? bare(value)),
      ),
      { numRuns: 3000 },
    );
  });

  it("prefixes the key with its owner so that no owner can name another owner's key", () => {
    const owned = (owner: unknown) =>
      requestIdempotencyKey(
        'Refunds.create',
        { ...MODE, owner: () => owner },
        { headers: { 'idempotency-key': '"k:1"' } },
        255,
      );
    expect(owned('user_42')).toBe('user_42:k:1');
    expect(owned(42)).toBe('42:k:1');
    // An owner with a colon is encoded, so "a:b" + "c" never equals "a" + "b:c".
    expect(owned('a:b')).toBe('a%3Ab:k:1');
    expect(() => owned(undefined)).toThrow('owner() returned undefined');
    expect(() => owned('')).toThrow('owner() returned an empty string');
  });

  it('fingerprints a Stripe event without pending_webhooks, and tells two events apart', () => {
    const fingerprint = webhookFingerprint(undefined, undefined, stripeEventKey) as (
      body: unknown,
      request: unknown,
    ) => string;
    const event = { id: 'evt_1', type: 'charge.succeeded', data: { object: { id: 'ch_1' } } };
    expect(fingerprint({ ...event, pending_webhooks: 3 }, {})).toBe(
      fingerprint({ ...event, pending_webhooks: 1 }, {}),
    );
    expect(fingerprint({ ...event, id: 'evt_2', type: 'charge.captured' }, {})).not.toBe(
      fingerprint(event, {}),
    );
    // The body preset hashes the raw bytes when the app keeps them.
    const body = webhookFingerprint('body', undefined, undefined) as (
      body: unknown,
      request: unknown,
    ) => string;
    expect(body({}, { rawBody: Buffer.from('{"a":1}') })).toBe(body({ a: 1 }, {}));
    expect(webhookFingerprint(false, undefined, undefined)).toBe(false);
    expect(webhookFingerprint('nope' as never, undefined, undefined)).toBeUndefined();
  });

  it('hashes to the digests of a Hash updated part by part, so claims stored before still match', () => {
    // What sha256Hex computed until it made one crypto.hash() call over the joined parts.
    const partByPart = (...parts: (string | Uint8Array)[]) => {
      const hash = createHash('sha256');
      for (const part of parts) hash.update(part);
      return hash.digest('hex');
    };
    const stripe = ['stripe\n', 'evt_1é', '\n', 'charge.succeeded', '\n', '1730000000'];
    expect(sha256Hex(...stripe)).toBe(partByPart(...stripe));
    const body = Buffer.from('{"amount":500,"note":"ünïcode ✓ 😀"}');
    expect(sha256Hex(body)).toBe(partByPart(body));
    expect(sha256Hex('{"a":"😀"}')).toBe(partByPart('{"a":"😀"}'));
    const request = ['POST', '\n', '/refunds?x=1', '\n', body] as const;
    expect(sha256Hex(...request)).toBe(partByPart(...request));
    // Request mode over the raw body and over the parsed one: the same digest as before.
    expect(
      requestFingerprint(MODE, {
        headers: {},
        method: 'POST',
        url: '/refunds?x=1',
        body: {},
        rawBody: body,
      } as never),
    ).toBe(partByPart(...request));
    expect(
      requestFingerprint(MODE, { headers: {}, method: 'POST', url: '/refunds', body: { a: 1 } } as never),
    ).toBe(partByPart('POST', '\n', '/refunds', '\n', '{"a":1}'));
  });

  it('conflicts only when both fingerprints are known and differ', () => {
    expect(fingerprintsConflict('a', 'b')).toBe(true);
    expect(fingerprintsConflict('a', 'a')).toBe(false);
    expect(fingerprintsConflict(null, 'b')).toBe(false);
    expect(fingerprintsConflict('a', null)).toBe(false);
    expect(fingerprintsConflict('a', undefined)).toBe(false);
  });

  it('finds one fingerprint under two keys within the window, and forgets it after', () => {
    const keys = new UnstableKeys(1_000, 10);
    expect(keys.see('S', 'fp', 'k1', 0)).toBeUndefined();
    expect(keys.see('S', 'fp', 'k1', 10)).toBeUndefined();
    expect(keys.see('S', 'fp', 'k2', 20)).toBe('k1');
    expect(keys.see('Other', 'fp', 'k2', 20)).toBeUndefined();
    expect(keys.see('S', 'fp', 'k3', 2_000)).toBeUndefined();
    expect(keys.see('S', 'fp', 'k4', 2_100)).toBe('k3');
  });

  it('remembers at most its capacity, dropping the older generation whole', () => {
    const keys = new UnstableKeys(60_000, 4);
    keys.see('S', 'a', 'ka', 0);
    keys.see('S', 'b', 'kb', 0);
    keys.see('S', 'c', 'kc', 0); // the first generation (a, b) becomes the previous one
    expect(keys.see('S', 'a', 'other', 1)).toBe('ka');
    keys.see('S', 'd', 'kd', 1); // the previous (a, b) is dropped
    keys.see('S', 'e', 'ke', 1);
    expect(keys.see('S', 'b', 'other', 2)).toBeUndefined();
  });
});
