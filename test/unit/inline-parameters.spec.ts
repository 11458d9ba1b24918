import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import pg from 'pg';
import { inlineParameters, literal } from '../../lib/postgres/inline-parameters.js';

/** pg's own quoting, as the claim transaction uses it. */
const escape = (value: string) => pg.Client.prototype.escapeLiteral.call(null, value);

describe('literal', () => {
  it.each([
    ['a plain string', 'evt_1'],
    ['the empty string', ''],
    ['a quote', "it's"],
    ['a backslash', 'a\\b'],
    ['both', "a\\'b"],
  ])('quotes %s as pg does', (_what, value) => {
    expect(literal(value, escape)).toBe(escape(value));
  });

  it('quotes any string exactly as pg does, quotes, backslashes and every code unit included', () => {
    // Strings rich in the two characters pg rewrites, and in everything else it leaves alone.
    const unit = fc.oneof(
      fc.constantFrom("'", '\\', '"', '$', '\n', '\u0000', '\ud800'),
      fc.integer({ min: 0, max: 0xffff }).map((code) => String.fromCharCode(code)),
    );
    const text = fc.array(unit, { maxLength: 40 }).map((units) => units.join(''));
    fc.assert(
      fc.property(text, (value) => literal(value, escape) === escape(value)),
      { numRuns: 2000 },
    );
  });
});

describe('inlineParameters', () => {
  it('replaces each $n by its value as a quoted literal, NULL for null and undefined', () => {
    expect(
      inlineParameters(
        'SELECT $1::int, $2, $3::jsonb, $4, $5, $10',
        [1, "it's", { a: 'b' }, null, undefined, true, 0, 0, 0, 'x'],
        escape,
      ),
    ).toBe(`SELECT '1'::int, 'it''s', '{"a":"b"}'::jsonb, NULL, NULL, 'x'`);
  });

  it('leaves quoted strings, quoted identifiers and comments alone', () => {
    const text = `SELECT '$1', "$1", $1 -- $1\n, /* $1 */ 'a''$1'`;
    expect(inlineParameters(text, ['v'], escape)).toBe(`SELECT '$1', "$1", 'v' -- $1\n, /* $1 */ 'a''$1'`);
  });

  it('quotes backslashes as pg does (an E string, which pg starts with a space)', () => {
    expect(inlineParameters('SELECT $1', ['a\\b'], escape)).toBe("SELECT  E'a\\\\b'");
  });

  it.each([
    ['SELECT $$x$$', [], 'dollar quoting'],
    ["SELECT E'\\''", [], "an E'' string"],
    ['SELECT $2', ['a'], 'no value for $2'],
    ["SELECT 'open", [], 'an unterminated quote'],
    ['SELECT $1', [[1, 2]], 'array or Buffer'],
    ['SELECT $1', [Buffer.from('x')], 'array or Buffer'],
  ])('refuses %s', (text, values, message) => {
    expect(() => inlineParameters(text, values, escape)).toThrow(message);
  });

  it.each([
    [
      'nesting deeper than the stack',
      () => {
        let deep: Record<string, unknown> = {};
        for (let depth = 0; depth < 40_000; depth++) deep = { deep };
        return deep;
      },
      'nests too deeply to be serialised',
    ],
    [
      'a cycle',
      () => {
        const cyclic: Record<string, unknown> = {};
        cyclic.self = cyclic;
        return cyclic;
      },
      'circular',
    ],
    ['a NUL character', () => ({ name: 'a\u0000b' }), 'holds a NUL character'],
    ['a lone surrogate', () => ({ name: 'a\ud800b' }), 'a lone UTF-16 surrogate'],
  ])('refuses JSON that jsonb cannot store: %s, naming why', (_what, value, reason) => {
    expect(() => inlineParameters('SELECT $1::jsonb', [value()], escape)).toThrow(
      `A value written with the COMMIT (a job's data) cannot be stored as JSON: it`,
    );
    expect(() => inlineParameters('SELECT $1::jsonb', [value()], escape)).toThrow(reason);
  });

  it('keeps JSON whose backslashes only look like a NUL escape, and paired surrogates', () => {
    // The six characters \u0000 (a backslash, then u0000), and an emoji: both storable.
    const value = { text: '\\u0000', emoji: '\u{1F600}' };
    expect(inlineParameters('SELECT $1::jsonb', [value], escape)).toBe(
      `SELECT ${escape(JSON.stringify(value))}::jsonb`,
    );
  });
});
