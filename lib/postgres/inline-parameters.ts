import { parameterNotInlinable, statementNotInlinable } from '../idempotency.messages.js';

/**
 * `text` with each `$n` replaced by the n-th value as a quoted literal, for a statement that must
 * travel in one simple query with others (a job written with its COMMIT). A quoted literal starts
 * out of unknown type and takes its type from where it stands, as an untyped parameter does, so
 * the statement means what it meant with parameters. Quoted strings, quoted identifiers and
 * comments are left alone; dollar quoting is refused rather than parsed.
 */
export function inlineParameters(
  text: string,
  values: readonly unknown[],
  escape: (value: string) => string,
): string {
  let out = '';
  let i = 0;
  while (i < text.length) {
    const char = text[i];
    if (char === "'" && /[Ee]/.test(text[i - 1] ?? '') && !/[\w$]/.test(text[i - 2] ?? '')) {
      throw new Error(statementNotInlinable("an E'' string"));
    } else if (char === "'" || char === '"') {
      // Up to the closing quote; a doubled quote is an escaped one and the scan just goes on.
      const end = text.indexOf(char, i + 1);
      if (end < 0) throw new Error(statementNotInlinable('an unterminated quote'));
      out += text.slice(i, end + 1);
      i = end + 1;
    } else if (char === '-' && text[i + 1] === '-') {
      const end = text.indexOf('\n', i);
      out += end < 0 ? text.slice(i) : text.slice(i, end);
      i = end < 0 ? text.length : end;
    } else if (char === '/' && text[i + 1] === '*') {
      const end = text.indexOf('*/', i + 2);
      if (end < 0) throw new Error(statementNotInlinable('an unterminated comment'));
      out += text.slice(i, end + 2);
      i = end + 2;
    } else if (char === '$') {
      const digits = /^\$(\d+)/.exec(text.slice(i, i + 12));
      if (!digits) throw new Error(statementNotInlinable('dollar quoting'));
      const index = Number(digits[1]) - 1;
      if (index < 0 || index >= values.length)
        throw new Error(statementNotInlinable(`no value for ${digits[0]}`));
      out += literal(values[index], escape);
      i += digits[0].length;
    } else {
      out += char;
      i++;
    }
  }
  return out;
}

/** One value as pg would send it as a text parameter, quoted. */
function literal(value: unknown, escape: (value: string) => string): string {
  if (value === null || value === undefined) return 'NULL';
  switch (typeof value) {
    case 'string':
      return escape(value);
    case 'number':
    case 'bigint':
    case 'boolean':
      return escape(String(value));
  }
  if (value instanceof Date) return escape(value.toISOString());
  // pg sends arrays as array literals and Buffers as bytea: no statement sent this way needs them.
  if (Array.isArray(value) || value instanceof Uint8Array)
    throw new Error(parameterNotInlinable(typeof value));
  if (typeof value === 'object') return escape(JSON.stringify(value));
  throw new Error(parameterNotInlinable(typeof value));
}
