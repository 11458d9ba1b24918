import { describe, expect, it } from '@jest/globals';
import pg from 'pg';
import { inlineParameters } from '../../lib/postgres/inline-parameters.js';

/** pg's own quoting, as the claim transaction uses it. */
const escape = (value: string) => pg.Client.prototype.escapeLiteral.call(null, value);

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
});
