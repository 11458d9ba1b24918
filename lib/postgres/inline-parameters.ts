import { createHash } from 'node:crypto';
import { parameterNotInlinable, statementNotInlinable } from '../idempotency.messages.js';

/** A statement cut at its placeholders: `pieces[k]`, then value `indexes[k]`, ..., then the last piece. */
export interface StatementTemplate {
  /** The statement, with its placeholders. */
  text: string;
  pieces: string[];
  indexes: number[];
  /** How many values it takes: its highest placeholder. */
  parameters: number;
  /** A name to PREPARE it under, the same for the same text in every process. */
  name: string;
}
type Template = StatementTemplate;

/** Templates of the statements seen so far (a library's few constant texts), so each is scanned once. */
const templates = new Map<string, Template>();
/** Beyond this many texts, one is forgotten for each new one: a caller building texts is not cached forever. */
const MAX_TEMPLATES = 64;

/**
 * `text` with each `$n` replaced by the n-th value as a quoted literal, for a statement that must
 * travel in one simple query with others (a job written with its COMMIT). A quoted literal starts
 * out of unknown type and takes its type from where it stands, as an untyped parameter does, so
 * the statement means what it meant with parameters. Quoted strings, quoted identifiers and
 * comments are left alone; dollar quoting and E'' strings are refused rather than parsed.
 */
export function inlineParameters(
  text: string,
  values: readonly unknown[],
  escape: (value: string) => string,
): string {
  const { pieces, indexes } = statementTemplate(text);
  let out = pieces[0];
  for (let k = 0; k < indexes.length; k++) {
    const index = indexes[k];
    if (index >= values.length) throw new Error(statementNotInlinable(`no value for $${index + 1}`));
    out += literal(values[index], escape) + pieces[k + 1];
  }
  return out;
}

/** The arguments of `EXECUTE name (...)` for `template`'s values, as quoted literals. */
export function executeArguments(
  template: StatementTemplate,
  values: readonly unknown[],
  escape: (value: string) => string,
): string {
  if (values.length < template.parameters) {
    throw new Error(statementNotInlinable(`no value for $${values.length + 1}`));
  }
  const literals: string[] = [];
  for (let index = 0; index < template.parameters; index++) literals.push(literal(values[index], escape));
  return `(${literals.join(', ')})`;
}

/** `text` cut at its placeholders, scanned once per text (the cache is bounded). */
export function statementTemplate(text: string): StatementTemplate {
  let template = templates.get(text);
  if (!template) {
    template = compile(text);
    if (templates.size >= MAX_TEMPLATES) templates.delete(templates.keys().next().value!);
    templates.set(text, template);
  }
  return template;
}

/** Cuts `text` at its placeholders, skipping quoted strings, quoted identifiers and comments. */
function compile(text: string): Template {
  const pieces: string[] = [];
  const indexes: number[] = [];
  let start = 0;
  let i = 0;
  while (i < text.length) {
    const char = text[i];
    if (char === "'" && /[Ee]/.test(text[i - 1] ?? '') && !/[\w$]/.test(text[i - 2] ?? '')) {
      throw new Error(statementNotInlinable("an E'' string"));
    } else if (char === "'" || char === '"') {
      // Up to the closing quote; a doubled quote is an escaped one and the scan just goes on.
      const end = text.indexOf(char, i + 1);
      if (end < 0) throw new Error(statementNotInlinable('an unterminated quote'));
      i = end + 1;
    } else if (char === '-' && text[i + 1] === '-') {
      const end = text.indexOf('\n', i);
      i = end < 0 ? text.length : end;
    } else if (char === '/' && text[i + 1] === '*') {
      const end = text.indexOf('*/', i + 2);
      if (end < 0) throw new Error(statementNotInlinable('an unterminated comment'));
      i = end + 2;
    } else if (char === '$') {
      const digits = /^\$(\d+)/.exec(text.slice(i, i + 12));
      if (!digits || Number(digits[1]) < 1) throw new Error(statementNotInlinable('dollar quoting'));
      pieces.push(text.slice(start, i));
      indexes.push(Number(digits[1]) - 1);
      i += digits[0].length;
      start = i;
    } else {
      i++;
    }
  }
  pieces.push(text.slice(start));
  const parameters = indexes.reduce((highest, index) => Math.max(highest, index + 1), 0);
  const name = `idempotency_deferred_${createHash('sha1').update(text).digest('hex').slice(0, 16)}`;
  return { text, pieces, indexes, parameters, name };
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
