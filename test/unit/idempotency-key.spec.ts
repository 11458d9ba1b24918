import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import {
  checkIdempotencyKey,
  extractIdempotencyKey,
  MAX_CLAIM_KEY_BYTES,
} from '../../lib/core/idempotency-key.js';
import { InvalidIdempotencyKeyError } from '../../lib/idempotency.errors.js';
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
