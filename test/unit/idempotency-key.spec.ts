import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { createHash } from 'node:crypto';
import {
  checkIdempotencyKey,
  extractIdempotencyKey,
  MAX_CLAIM_KEY_BYTES,
} from '../../lib/core/idempotency-key.js';
import {
  IdempotencyOwnerUnknownError,
  InvalidIdempotencyKeyError,
  UnparsedRequestBodyError,
} from '../../lib/idempotency.errors.js';
import {
  clientKey,
  requestFingerprint,
  requestIdempotencyKey,
  type RequestMode,
} from '../../lib/transports/http/request-mode.js';
import {
  keyEmpty,
  keyExtractorThrew,
  keyHasControl,
  keyHasNul,
  keyNotString,
  keyNotWellFormed,
  keyTooLong,
  keyTooManyBytes,
} from '../../lib/core/idempotency-key.js';

const SCOPE = 'PaymentsController.stripe';
/** The module's default maxKeyLength. */
const MAX = 255;

/** What `run` threw; fails the test if it returned instead. */
function thrown(run: () => unknown): unknown {
  try {
    run();
  } catch (error) {
    return error;
  }
  throw new Error('expected a rejection, but the key was accepted');
}

/** Asserts `run` rejected the key the way every transport relies on: the class, scope and exact message. */
function expectRejected(run: () => unknown, message: string): void {
  const error = thrown(run);
  expect(error).toBeInstanceOf(InvalidIdempotencyKeyError);
  expect(error).toMatchObject({ message, scope: SCOPE, key: undefined, code: 'IDEMPOTENCY_INVALID_KEY' });
}

/** V8's own well-formedness check (ES2024), the oracle for the library's regular expression. */
const isWellFormed = (value: string) => (value as unknown as { isWellFormed(): boolean }).isWellFormed();

/**
 * One code point a key may hold, from every UTF-16 range: ASCII, the rest of the BMP, astral (a
 * pair). Not a control character (C0, DEL, C1), which no key may hold.
 */
const codePoint = fc
  .oneof(
    fc.integer({ min: 0x20, max: 0x7e }),
    fc.integer({ min: 0xa0, max: 0xd7ff }),
    fc.integer({ min: 0xe000, max: 0xffff }),
    fc.integer({ min: 0x10000, max: 0x10ffff }),
  )
  .map((point) => String.fromCodePoint(point));

/** A control character other than NUL: C0, DEL, C1. */
const controlUnit = fc
  .oneof(fc.integer({ min: 0x01, max: 0x1f }), fc.integer({ min: 0x7f, max: 0x9f }))
  .map((unit) => String.fromCharCode(unit));

/** The first control character other than NUL in `key`, the library's rule restated. */
function firstControl(key: string): { character: string; index: number } | undefined {
  for (let index = 0; index < key.length; index++) {
    const unit = key.charCodeAt(index);
    if ((unit >= 0x01 && unit <= 0x1f) || (unit >= 0x7f && unit <= 0x9f)) {
      return { character: key[index], index };
    }
  }
  return undefined;
}

/** One UTF-16 code unit, lone surrogates and control characters included: strings no well-behaved sender produces. */
const codeUnit = fc
  .oneof(
    fc.constantFrom(0x00, 0x0a, 0x7f, 0x85, 0xd800, 0xdbff, 0xdc00, 0xdfff),
    fc.integer({ min: 0xd800, max: 0xdfff }),
    fc.integer({ min: 0x00, max: 0xffff }),
  )
  .map((unit) => String.fromCharCode(unit));

describe('checkIdempotencyKey', () => {
  it.each([
    ['undefined', undefined],
    ['null', null],
    ['number', 42],
    ['boolean', true],
    ['bigint', 42n],
    ['object', { id: 'evt_1' }],
    ['object', ['evt_1']],
    ['function', () => 'evt_1'],
  ])('rejects a key that is not a string (%s)', (_type, key) => {
    expectRejected(() => checkIdempotencyKey(SCOPE, key, MAX), keyNotString(SCOPE, key));
  });

  it('names the type in the message, null apart from object', () => {
    expect(keyNotString(SCOPE, null)).toBe(`Idempotency key of ${SCOPE} must be a string, got null`);
    expect(keyNotString(SCOPE, {})).toBe(`Idempotency key of ${SCOPE} must be a string, got object`);
    expect(keyNotString(SCOPE, undefined)).toBe(
      `Idempotency key of ${SCOPE} must be a string, got undefined`,
    );
  });

  it('rejects an empty key', () => {
    expectRejected(() => checkIdempotencyKey(SCOPE, '', MAX), keyEmpty(SCOPE));
  });

  it('rejects a key one character longer than the maximum, giving both lengths', () => {
    const key = 'k'.repeat(MAX + 1);
    expectRejected(() => checkIdempotencyKey(SCOPE, key, MAX), keyTooLong(SCOPE, MAX + 1, MAX));
    expect(keyTooLong(SCOPE, MAX + 1, MAX)).toContain(`is ${MAX + 1} characters long; the maximum is ${MAX}`);
  });

  it('counts UTF-16 code units: an emoji is two, so 128 of them exceed 255', () => {
    const key = '😀'.repeat(128);
    expectRejected(() => checkIdempotencyKey(SCOPE, key, MAX), keyTooLong(SCOPE, 256, MAX));
  });

  it.each([
    ['at the start', '\u0000evt_1'],
    ['in the middle', 'evt\u00001'],
    ['at the end', 'evt_1\u0000'],
    ['alone', '\u0000'],
  ])('rejects a key with a NUL character %s', (_where, key) => {
    expectRejected(() => checkIdempotencyKey(SCOPE, key, MAX), keyHasNul(SCOPE));
  });

  it.each([
    ['a newline', 'evt\n1', '\n', 3],
    ['a carriage return', '\revt', '\r', 0],
    ['a tab', 'evt_\t', '\t', 4],
    ['U+0001', 'e\u0001', '\u0001', 1],
    ['U+001F', 'e\u001f', '\u001f', 1],
    ['DEL (U+007F)', 'evt\u007f', '\u007f', 3],
    ['NEL (U+0085, C1)', 'évt\u0085', '\u0085', 3],
    ['U+009F, the last of C1', '\u009f', '\u009f', 0],
  ])(
    'rejects a key with a control character (%s), naming its code point and index',
    (_what, key, character, index) => {
      expectRejected(() => checkIdempotencyKey(SCOPE, key, MAX), keyHasControl(SCOPE, character, index));
    },
  );

  it('names the first control character by its code point', () => {
    expect(keyHasControl(SCOPE, '\n', 3)).toBe(
      `Idempotency key of ${SCOPE} contains the control character U+000A (at index 3), which no HTTP header carries intact: such a key could not be sent downstream`,
    );
    expect(keyHasControl(SCOPE, '\u0085', 0)).toContain('U+0085 (at index 0)');
    expectRejected(() => checkIdempotencyKey(SCOPE, 'a\u007fb\nc', MAX), keyHasControl(SCOPE, '\u007f', 1));
  });

  it('reports NUL for its own reason even after another control character', () => {
    expectRejected(() => checkIdempotencyKey(SCOPE, 'a\nb\u0000', MAX), keyHasNul(SCOPE));
  });

  it.each([
    ['a lone high surrogate at the end', 'evt_\uD83D'],
    ['a lone high surrogate before a letter', '\uD83Dx'],
    ['a lone low surrogate', 'evt_\uDE00'],
    ['a low surrogate before its high one (reversed pair)', '\uDE00\uD83D'],
    ['two high surrogates', '\uD83D\uD83D\uDE00'],
  ])('rejects a key with %s', (_what, key) => {
    expectRejected(() => checkIdempotencyKey(SCOPE, key, MAX), keyNotWellFormed(SCOPE));
  });

  it('checks length before content: a too-long key with a NUL is reported as too long', () => {
    const key = `\u0000${'k'.repeat(MAX)}`;
    expectRejected(() => checkIdempotencyKey(SCOPE, key, MAX), keyTooLong(SCOPE, MAX + 1, MAX));
  });

  it.each([
    ['a Stripe event id', 'evt_1NXWPnHIKdBQ9Vt9q0J3zJqC'],
    ['a UUID', '5f0c6f0e-6d6b-4b8e-9d62-1d0f3c6c2c55'],
    ['emoji (surrogate pairs)', '😀🎉👍🏽'],
    ['a ZWJ family emoji', '👨‍👩‍👧‍👦'],
    ['non-Latin scripts', 'заказ-注文-طلب-🦄'],
    ['combining marks', 'e\u0301vt'],
    ['one character', 'k'],
    ['spaces (not control characters)', '  evt 1  '],
    ['the characters right outside the control ranges', '\u0020\u007e\u00a0\u00ff'],
    ['a private-use code point', '\uE000\u{10FFFD}'],
  ])('accepts %s unchanged', (_what, key) => {
    expect(checkIdempotencyKey(SCOPE, key, MAX)).toBe(key);
  });

  it('accepts a key of exactly the maximum length, ASCII or with emoji', () => {
    const ascii = 'k'.repeat(MAX);
    expect(checkIdempotencyKey(SCOPE, ascii, MAX)).toBe(ascii);
    const emoji = `k${'😀'.repeat((MAX - 1) / 2)}`;
    expect(emoji).toHaveLength(MAX);
    expect(checkIdempotencyKey(SCOPE, emoji, MAX)).toBe(emoji);
    expect(checkIdempotencyKey(SCOPE, 'abc', 3)).toBe('abc');
  });

  describe('with a maxKeyLength raised far above the default', () => {
    /** Large enough that only the byte bound applies. */
    const ROOMY = 100_000;
    const SCOPE_BYTES = Buffer.byteLength(SCOPE);
    /** A key of exactly `bytes` UTF-8 bytes in `char`'s script, padded with ASCII. */
    const keyOfBytes = (char: string, bytes: number) => {
      const width = Buffer.byteLength(char);
      return char.repeat(Math.floor(bytes / width)) + 'k'.repeat(bytes % width);
    };

    it.each([
      ['ASCII', 'k'],
      ['2-byte Cyrillic', 'ж'],
      ['3-byte CJK', '注'],
      ['4-byte emoji', '😀'],
    ])(
      'accepts a %s key that fills the index entry with its scope, and refuses one byte more',
      (_script, char) => {
        const fits = keyOfBytes(char, MAX_CLAIM_KEY_BYTES - SCOPE_BYTES);
        expect(checkIdempotencyKey(SCOPE, fits, ROOMY)).toBe(fits);
        const over = `${fits}k`;
        expectRejected(
          () => checkIdempotencyKey(SCOPE, over, ROOMY),
          keyTooManyBytes(SCOPE, Buffer.byteLength(over), SCOPE_BYTES, MAX_CLAIM_KEY_BYTES),
        );
      },
    );

    it('counts the scope too: a longer scope leaves the key fewer bytes', () => {
      const scope = `${'S'.repeat(200)}.handle`;
      const key = 'k'.repeat(MAX_CLAIM_KEY_BYTES - SCOPE_BYTES);
      expect(checkIdempotencyKey(SCOPE, key, ROOMY)).toBe(key);
      const error = thrown(() => checkIdempotencyKey(scope, key, ROOMY));
      expect(error).toMatchObject({
        message: keyTooManyBytes(scope, key.length, scope.length, MAX_CLAIM_KEY_BYTES),
        scope,
      });
      expect(keyTooManyBytes(SCOPE, 3000, 25, 2600)).toBe(
        `Idempotency key of ${SCOPE} is 3000 bytes in UTF-8; with its scope's 25 that is more than the 2600 bytes PostgreSQL's index on the claims table can hold`,
      );
    });

    it('never refuses a key within the default maxKeyLength for its bytes, whatever its script and scope', () => {
      const scope = '注'.repeat(255);
      const key = '注'.repeat(MAX);
      expect(checkIdempotencyKey(scope, key, MAX)).toBe(key);
    });

    it('property: a long well-formed key is accepted exactly when it and its scope fit in the bound', () => {
      const longKey = fc.string({ unit: codePoint, minLength: 300, maxLength: 2_000, size: 'max' });
      fc.assert(
        fc.property(longKey, (key) => {
          const bytes = Buffer.byteLength(key);
          if (SCOPE_BYTES + bytes <= MAX_CLAIM_KEY_BYTES)
            expect(checkIdempotencyKey(SCOPE, key, ROOMY)).toBe(key);
          else
            expectRejected(
              () => checkIdempotencyKey(SCOPE, key, ROOMY),
              keyTooManyBytes(SCOPE, bytes, SCOPE_BYTES, MAX_CLAIM_KEY_BYTES),
            );
        }),
        { numRuns: 300 },
      );
    });
  });

  it('property: any well-formed string of length 1..max without control characters is accepted unchanged', () => {
    const keyAndMax = fc
      .string({ unit: codePoint, minLength: 1, maxLength: 64, size: 'max' })
      .chain((key) => fc.tuple(fc.constant(key), fc.integer({ min: key.length, max: key.length + 300 })));
    fc.assert(
      fc.property(keyAndMax, ([key, max]) => {
        expect(checkIdempotencyKey(SCOPE, key, max)).toBe(key);
      }),
      { numRuns: 1000 },
    );
  });

  it('property: the same at the default maximum of 255, including keys of exactly 255', () => {
    const key = fc
      // size 'max': lengths spread over the whole range, not fast-check's usual handful of characters.
      .string({ unit: codePoint, minLength: 1, maxLength: MAX, size: 'max' })
      .map((candidate) => {
        // Astral code points are two units: trim whole code points until it fits.
        const points = [...candidate];
        while (points.join('').length > MAX) points.pop();
        return points.join('');
      })
      .filter((candidate) => candidate.length > 0);
    fc.assert(
      fc.property(key, (candidate) => {
        expect(checkIdempotencyKey(SCOPE, candidate, MAX)).toBe(candidate);
      }),
      { numRuns: 300 },
    );
  });

  it('property: any string containing NUL is rejected (as too long if it is, else for the NUL)', () => {
    const withNul = fc
      .tuple(fc.string({ unit: codeUnit, maxLength: 40 }), fc.string({ unit: codeUnit, maxLength: 40 }))
      .map(([before, after]) => `${before}\u0000${after}`);
    fc.assert(
      fc.property(withNul, fc.integer({ min: 1, max: 100 }), (key, max) => {
        const message = key.length > max ? keyTooLong(SCOPE, key.length, max) : keyHasNul(SCOPE);
        expectRejected(() => checkIdempotencyKey(SCOPE, key, max), message);
      }),
      { numRuns: 1000 },
    );
  });

  it('property: a key with a control character is rejected, naming the first one', () => {
    const withControl = fc
      .tuple(
        fc.string({ unit: codePoint, maxLength: 40 }),
        controlUnit,
        fc.string({ unit: fc.oneof(codePoint, controlUnit), maxLength: 40 }),
      )
      .map(([before, control, after]) => ({
        key: `${before}${control}${after}`,
        control,
        index: before.length,
      }));
    fc.assert(
      fc.property(withControl, ({ key, control, index }) => {
        expectRejected(() => checkIdempotencyKey(SCOPE, key, 200), keyHasControl(SCOPE, control, index));
      }),
      { numRuns: 1000 },
    );
  });

  it('property: on arbitrary UTF-16, accepted exactly when V8 calls it well-formed and it has no control character', () => {
    fc.assert(
      fc.property(fc.string({ unit: codeUnit, minLength: 1, maxLength: 30, size: 'max' }), (key) => {
        const control = firstControl(key);
        const expected = key.includes('\u0000')
          ? keyHasNul(SCOPE)
          : control
            ? keyHasControl(SCOPE, control.character, control.index)
            : isWellFormed(key)
              ? undefined
              : keyNotWellFormed(SCOPE);
        if (expected === undefined) expect(checkIdempotencyKey(SCOPE, key, MAX)).toBe(key);
        else expectRejected(() => checkIdempotencyKey(SCOPE, key, MAX), expected);
      }),
      { numRuns: 2000 },
    );
  });
});

describe('extractIdempotencyKey', () => {
  it('passes the delivery arguments to the extractor and checks what it returns', () => {
    const body = { id: 'evt_1' };
    const request = { headers: { 'x-github-delivery': 'gh-1' } };
    const seen: unknown[][] = [];
    const key = extractIdempotencyKey(
      SCOPE,
      (...args: unknown[]) => {
        seen.push(args);
        return (args[0] as { id: string }).id;
      },
      [body, request],
      MAX,
    );
    expect(key).toBe('evt_1');
    expect(seen).toEqual([[body, request]]);
  });

  it('turns an extractor that throws an Error into a bad key naming the scope and the error', () => {
    const failure = new TypeError("Cannot read properties of undefined (reading 'id')");
    expectRejected(
      () =>
        extractIdempotencyKey(
          SCOPE,
          () => {
            throw failure;
          },
          [undefined],
          MAX,
        ),
      keyExtractorThrew(SCOPE, failure),
    );
    expect(keyExtractorThrew(SCOPE, failure)).toBe(
      `Idempotency key extractor of ${SCOPE} threw: Cannot read properties of undefined (reading 'id')`,
    );
  });

  it('turns an extractor that throws a non-Error into a bad key too', () => {
    expectRejected(
      () =>
        extractIdempotencyKey(
          SCOPE,
          () => {
            throw 'no id header';
          },
          [],
          MAX,
        ),
      `Idempotency key extractor of ${SCOPE} threw: no id header`,
    );
  });

  it.each([
    ['undefined', undefined, keyNotString(SCOPE, undefined)],
    ['a number', 7, keyNotString(SCOPE, 7)],
    ['an empty string', '', keyEmpty(SCOPE)],
    ['a NUL', 'a\u0000b', keyHasNul(SCOPE)],
    ['a newline', 'a\nb', keyHasControl(SCOPE, '\n', 1)],
    ['a lone surrogate', '\uD800', keyNotWellFormed(SCOPE)],
    ['a too-long key', 'k'.repeat(11), keyTooLong(SCOPE, 11, 10)],
  ])('applies the same checks to what the extractor returns (%s)', (_what, value, message) => {
    expectRejected(() => extractIdempotencyKey(SCOPE, () => value, [], 10), message);
  });
});

describe('request mode: the Idempotency-Key header, the owner and the fingerprint', () => {
  const SCOPE_R = 'RefundsController.create';
  const mode = (extra: Partial<RequestMode> = {}): RequestMode => ({
    required: true,
    strictKeySyntax: false,
    replayHeaders: [],
    ...extra,
  });
  const keyOf = (header: string | string[], options: Partial<RequestMode> = {}) =>
    requestIdempotencyKey(SCOPE_R, mode(options), { headers: { 'idempotency-key': header } }, MAX);

  it.each([
    ['a UUID', '8e03978e-40d5-43e8-bc93-6894a57f9324'],
    ['base64url', 'q1w2-E3r4_T5y6'],
    ['a short token', 'k2'],
    ['digits', '123'],
    ['visible ASCII punctuation', "a;b=1/c:d?e&f!#$%'()*+.[]^`{|}~\\@<>"],
  ])('takes a bare key (%s) as the whole header value', (_what, bare) => {
    expect(keyOf(bare)).toBe(bare);
  });

  it('reads "k2" and k2 as the same key, quoted through the fast path or the parser', () => {
    expect(keyOf('"k2"')).toBe('k2');
    expect(keyOf('k2')).toBe('k2');
    expect(keyOf('"k2";v=1')).toBe('k2');
    expect(keyOf('"k\\"2"')).toBe('k"2');
  });

  it.each([
    ['a space inside', 'two words'],
    ['two headers joined', ['k1', 'k2']],
    ['a comma', 'k1,k2'],
    ['an unterminated string', '"k1'],
    ['a quote inside', 'k"1'],
    ['a character above ASCII', 'clé'],
    ['a control character', 'k\u00011'],
  ])('refuses a key that is neither an sf-string nor bare (%s), naming both forms', (_what, header) => {
    const error = thrown(() => keyOf(header));
    expect(error).toBeInstanceOf(InvalidIdempotencyKeyError);
    expect((error as Error).message).toContain('a quoted string');
    expect((error as Error).message).toContain('bare key');
  });

  it('strictKeySyntax refuses a bare key naming the draft syntax, and takes the quoted one', () => {
    const error = thrown(() => keyOf('k2', { strictKeySyntax: true }));
    expect(error).toBeInstanceOf(InvalidIdempotencyKeyError);
    expect((error as Error).message).toContain('must be a quoted string, as the IETF draft writes it');
    expect((error as Error).message).not.toContain('bare key');
    expect(keyOf('"k2"', { strictKeySyntax: true })).toBe('k2');
  });

  it('keeps the 255-character limit of the key part: 400, however it is written', () => {
    expect(thrown(() => keyOf('k'.repeat(256)))).toBeInstanceOf(InvalidIdempotencyKeyError);
    expect(thrown(() => keyOf(`"${'k'.repeat(256)}"`))).toBeInstanceOf(InvalidIdempotencyKeyError);
    expect(keyOf('k'.repeat(255))).toBe('k'.repeat(255));
  });

  describe('the owner in the claim key', () => {
    const withOwner = (owner: unknown) => keyOf('"k"', { owner: () => owner })!;

    it('prefixes a short owner as it is (URI-encoded), as earlier releases stored it', () => {
      expect(withOwner('user_42')).toBe('user_42:k');
      expect(withOwner(42)).toBe('42:k');
      expect(withOwner('a:b c')).toBe('a%3Ab%20c:k');
      expect(withOwner('o'.repeat(255))).toBe(`${'o'.repeat(255)}:k`);
    });

    it('replaces an owner longer than 255 characters by a fixed-length hash', () => {
      for (const owner of ['o'.repeat(256), 'o'.repeat(10_000), 'é'.repeat(300), 'x'.repeat(100_000)]) {
        const key = withOwner(owner);
        expect(key).toMatch(/^sha256=[0-9a-f]{64}:k$/);
        expect(withOwner(owner)).toBe(key);
      }
    });

    it('keeps every owner of at most 255 characters as earlier releases stored it, but one that cannot fit the index', () => {
      // 255 characters of 9 encoded characters each: 2295, as earlier releases stored it.
      expect(withOwner('注'.repeat(255))).toBe(`${encodeURIComponent('注'.repeat(255))}:k`);
      // With a scope and a key of 255 characters each it would pass the index's bound: no claim
      // with it was ever stored, and the hash form keeps it storable.
      const owner = '注'.repeat(255);
      const [scope, key] = ['S'.repeat(255), 'k'.repeat(255)];
      const owned = (which: string) =>
        requestIdempotencyKey(
          which,
          mode({ owner: () => owner }),
          { headers: { 'idempotency-key': key } },
          MAX,
        )!;
      expect(owned(SCOPE_R)).toBe(`${encodeURIComponent(owner)}:${key}`);
      expect(owned(scope)).toMatch(new RegExp(`^sha256=[0-9a-f]{64}:${key}$`));
      expect(Buffer.byteLength(scope) + Buffer.byteLength(owned(scope))).toBeLessThanOrEqual(
        MAX_CLAIM_KEY_BYTES,
      );
    });

    it('keeps two long owners that share a prefix apart', () => {
      const prefix = 'o'.repeat(9_999);
      expect(withOwner(`${prefix}a`)).not.toBe(withOwner(`${prefix}b`));
    });

    it('hashes an owner with a lone surrogate (which has no URI encoding) without meeting another', () => {
      const lone = withOwner('user\uD800');
      expect(lone).toMatch(/^sha256=[0-9a-f]{64}:k$/);
      expect(lone).not.toBe(withOwner('user\uD801'));
      expect(lone).not.toBe(withOwner('user\uFFFD'));
    });

    it('property: a hash form never equals a plain form, nor one owner the key of another', () => {
      const owner = fc.string({ unit: codeUnit, minLength: 1, maxLength: 400, size: 'max' });
      fc.assert(
        fc.property(owner, owner, (a, b) => {
          const [ka, kb] = [withOwner(a), withOwner(b)];
          // The owner part holds no colon: the client's key is what follows the first one.
          expect(ka.slice(ka.indexOf(':') + 1)).toBe('k');
          // A plain form is URI-encoded, which never leaves a '=': it cannot be a hash form.
          const prefix = ka.slice(0, ka.indexOf(':'));
          expect(prefix.startsWith('sha256=') || !prefix.includes('=')).toBe(true);
          if (a !== b) expect(ka).not.toBe(kb);
        }),
        { numRuns: 500 },
      );
    });

    it('still refuses an owner that gives nothing, naming what it returned and not the owner', () => {
      for (const owner of [undefined, null, '', Number.NaN, {}]) {
        const error = thrown(() => withOwner(owner));
        expect(error).toBeInstanceOf(IdempotencyOwnerUnknownError);
      }
    });

    it("names the client's key, never the owner, in the key as answered", () => {
      const owned = mode({ owner: () => 'user_42' });
      expect(clientKey(owned, 'user_42:k:with:colons')).toBe('k:with:colons');
      expect(clientKey(owned, `sha256=${'0'.repeat(64)}:k`)).toBe('k');
      expect(clientKey(mode(), 'user_42:k')).toBe('user_42:k');
    });
  });

  describe('the body the fingerprint hashes', () => {
    const post = (headers: Record<string, string>, fields: Record<string, unknown>) => ({
      headers: { 'idempotency-key': '"k"', ...headers },
      method: 'POST',
      url: '/refunds',
      ...fields,
    });
    const fingerprintOf = (request: ReturnType<typeof post>) => requestFingerprint(mode(), request);

    it('refuses 415 a body no parser read (the stream not read to its end), naming its type, before any claim', () => {
      const unread = post(
        { 'content-type': 'Text/Plain; charset=utf-8', 'content-length': '9' },
        {
          readableEnded: false,
        },
      );
      const error = thrown(() => requestIdempotencyKey(SCOPE_R, mode(), unread, MAX));
      expect(error).toBeInstanceOf(UnparsedRequestBodyError);
      expect(error).toMatchObject({ code: 'IDEMPOTENCY_BODY_UNPARSED', scope: SCOPE_R });
      expect((error as UnparsedRequestBodyError).getStatus()).toBe(415);
      expect((error as Error).message).toContain('text/plain');
      expect((error as Error).message).toContain('useBodyParser');
      // Fastify's request holds Node's as `raw`; a chunked body is a body too.
      const fastify = post(
        { 'content-type': 'application/xml', 'transfer-encoding': 'chunked' },
        {
          raw: { readableEnded: false },
        },
      );
      expect(thrown(() => requestIdempotencyKey(SCOPE_R, mode(), fastify, MAX))).toBeInstanceOf(
        UnparsedRequestBodyError,
      );
    });

    it('lets through what it can hash: no body, a parsed body, raw bytes, a text or a Buffer body', () => {
      const cases = [
        post({ 'content-length': '0' }, { readableEnded: false }),
        post({}, {}),
        post(
          { 'content-type': 'application/json', 'content-length': '2' },
          { readableEnded: true, body: {} },
        ),
        post(
          { 'content-type': 'text/plain', 'content-length': '1' },
          { readableEnded: false, rawBody: Buffer.from('a') },
        ),
        post({ 'content-type': 'text/plain', 'content-length': '1' }, { readableEnded: false, body: 'a' }),
        post(
          { 'content-type': 'x/y', 'content-length': '1' },
          { readableEnded: false, body: Buffer.from('a') },
        ),
      ];
      for (const request of cases) expect(requestIdempotencyKey(SCOPE_R, mode(), request, MAX)).toBe('k');
      // A route with its own fingerprint (or none) reads the request itself: nothing is refused.
      const unread = post({ 'content-type': 'text/plain', 'content-length': '9' }, { readableEnded: false });
      expect(requestIdempotencyKey(SCOPE_R, mode({ fingerprint: false }), unread, MAX)).toBe('k');
      expect(requestIdempotencyKey(SCOPE_R, mode({ fingerprint: () => 'mine' }), unread, MAX)).toBe('k');
    });

    it('hashes the bytes and their media type: another body or another type is another request', () => {
      const text = (body: string, type = 'text/plain') =>
        fingerprintOf(
          post(
            { 'content-type': type, 'content-length': String(body.length) },
            { body, readableEnded: true },
          ),
        );
      expect(text('refund 10')).not.toBe(text('refund 99999'));
      expect(text('refund 10')).toBe(text('refund 10'));
      expect(text('<a/>', 'application/xml')).not.toBe(text('<a/>', 'text/plain'));
      expect(text('<a/>', 'Application/XML; charset=utf-8')).toBe(text('<a/>', 'application/xml'));
      const bytes = Buffer.from([0, 1, 2]);
      const raw = fingerprintOf(post({ 'content-type': 'application/octet-stream' }, { body: bytes }));
      expect(raw).toBe(
        fingerprintOf(post({ 'content-type': 'application/octet-stream' }, { rawBody: bytes })),
      );
      expect(raw).not.toBe(fingerprintOf(post({ 'content-type': 'application/x-other' }, { body: bytes })));
    });

    it('keeps the fingerprint of a JSON or bodiless request as earlier releases stored it', () => {
      const sha = (text: string) => createHash('sha256').update(text).digest('hex');
      const raw = '{"amount": 5}';
      expect(fingerprintOf(post({ 'content-type': 'application/json' }, { rawBody: Buffer.from(raw) }))).toBe(
        sha(`POST\n/refunds\n${raw}`),
      );
      expect(
        fingerprintOf(post({ 'content-type': 'application/json; charset=utf-8' }, { body: { amount: 5 } })),
      ).toBe(sha('POST\n/refunds\n{"amount":5}'));
      expect(fingerprintOf(post({}, {}))).toBe(sha('POST\n/refunds\nnull'));
      // The same bytes as JSON and as text are two requests.
      expect(fingerprintOf(post({ 'content-type': 'text/plain' }, { body: raw }))).not.toBe(
        sha(`POST\n/refunds\n${raw}`),
      );
    });
  });
});
