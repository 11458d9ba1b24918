import type * as LibPgQuery from 'libpg-query';
import { loadOptionalPeer } from '../core/optional-peer.js';
import {
  DML,
  KINDS,
  READ_ONLY_FUNCTIONS,
  SEQUENCE_FUNCTIONS,
  SESSION_COMMANDS,
  VOLATILE_READ_ONLY_FUNCTIONS,
} from './statement-kinds.constants.js';

export { READ_ONLY_FUNCTIONS, VOLATILE_READ_ONLY_FUNCTIONS } from './statement-kinds.constants.js';

/**
 * What a statement does to the database, as PostgreSQL's parser reads it: `read` changes nothing
 * a rollback could undo (a query, a lock, a session command), `write` does (DML, a data-modifying
 * WITH, SELECT INTO, COPY FROM, TRUNCATE, DDL, a PREPARE of one), and `undecided` hides its effect where its text
 * cannot show it (a function of the app's own, CALL, DO, EXECUTE, a text the parser refuses) or
 * has one that is no write but escapes the claim all the same (NOTIFY).
 */
export type StatementEffect = 'read' | 'write' | 'undecided';

/** A table a statement writes, as it names it (unquoted; the schema only when the text gives one). */
export interface WrittenTable {
  readonly schema?: string;
  readonly name: string;
}

/** A statement's effect, its kind, the tables it writes and why: what the outside-write check says. */
export interface StatementClass {
  readonly effect: StatementEffect;
  /**
   * The statement's kind as SQL names it (`INSERT`, `SELECT`, `CALL`, `CREATE INDEX`...): of the
   * statement that decided the effect, in a string of several.
   */
  readonly kind: string;
  /**
   * The tables written, each once: a statement's own before its WITH's, statements in the
   * string's order; empty for reads and undecided ones.
   */
  readonly tables: readonly WrittenTable[];
  /** Why, as a phrase for a log line that follows the statement: `calls app.touch(), not one of...`. */
  readonly reason: string;
}

/** The parse tree as far as the classifier reads it: libpg-query's `parseSync` result. */
export interface ParseTree {
  stmts?: { stmt?: unknown }[];
}

/** Bounds of the cache of classified texts (TypeORM sends parameters apart, so texts repeat). */
export interface ClassifierCacheOptions {
  /**
   * Texts kept; the least recently classified goes first.
   * @default 500
   */
  entries?: number;
  /**
   * Longer texts are classified every time rather than kept (a text inlining its values is
   * unlikely to repeat).
   * @default 16384
   */
  maxLength?: number;
}

/** Statements whose effect lies where the text does not show it. */
const HIDDEN_EFFECTS: Record<string, (body: Record<string, unknown>) => string> = {
  CallStmt: (body) =>
    `runs the procedure ${funcName(record(body.funccall))}() (CALL), whose effects its text does not show`,
  DoStmt: () => 'runs an anonymous code block (DO), whose effects its text does not show',
  ExecuteStmt: (body) =>
    `runs the prepared statement ${String(body.name)} (EXECUTE), whose text is not in this one`,
  LoadStmt: () => 'loads a shared library (LOAD), whose effects its text does not show',
};

/** What one statement of a string was found to do. */
interface Finding {
  effect: StatementEffect;
  kind: string;
  tables: WrittenTable[];
  reason: string;
}

/**
 * SQL text → `read` | `write` | `undecided`, with the tables written and why, from PostgreSQL's
 * own parser (libpg-query) rather than a pattern: comments, literals, quoted identifiers and
 * dollar quotes are what the server takes them for. Pure but for its cache (per SQL text,
 * bounded); `parse` is the parser's synchronous entry, which throws on text it refuses.
 */
export class StatementClassifier {
  private readonly cache = new Map<string, StatementClass>();
  private readonly entries: number;
  private readonly maxLength: number;

  constructor(
    private readonly parse: (sql: string) => ParseTree,
    cache: ClassifierCacheOptions = {},
  ) {
    this.entries = cache.entries ?? 500;
    this.maxLength = cache.maxLength ?? 16_384;
  }

  /** The classification of `sql`, from the cache when this text was classified before. */
  classify(sql: string): StatementClass {
    const cached = this.cache.get(sql);
    if (cached) {
      // Kept most recent: the statements a handler sends every delivery stay in.
      this.cache.delete(sql);
      this.cache.set(sql, cached);
      return cached;
    }
    const found = Object.freeze(this.classifyText(sql));
    if (sql.length <= this.maxLength) {
      if (this.cache.size >= this.entries) this.cache.delete(this.cache.keys().next().value as string);
      this.cache.set(sql, found);
    }
    return found;
  }

  /** How many texts the cache holds (for the tests of its bound). */
  get cached(): number {
    return this.cache.size;
  }

  private classifyText(sql: string): StatementClass {
    let tree: ParseTree;
    try {
      // The parser refuses an empty text, which the server runs as an empty query.
      if (sql.trim() === '')
        return { effect: 'read', kind: 'empty', tables: [], reason: 'is an empty query' };
      tree = this.parse(sql);
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      return {
        effect: 'undecided',
        kind: 'unparsable',
        tables: [],
        reason: `was refused by PostgreSQL's parser (${message})`,
      };
    }
    const findings = (tree.stmts ?? []).map(({ stmt }) => classifyStatement(record(stmt)));
    if (findings.length === 0) {
      return { effect: 'read', kind: 'empty', tables: [], reason: 'holds comments only, no statement' };
    }
    // Any write makes the string a write (its tables all named); else any undecided part decides.
    const writes = findings.filter((finding) => finding.effect === 'write');
    if (writes.length > 0) {
      return { ...writes[0], tables: dedupe(writes.flatMap((write) => write.tables)) };
    }
    return findings.find((finding) => finding.effect === 'undecided') ?? findings[0];
  }
}

/**
 * Loads PostgreSQL's parser (libpg-query, WebAssembly: compiled once per process, about 25 ms)
 * and returns a classifier on it, whose `classify` is synchronous. libpg-query is a dependency;
 * it is loaded here, not by a static import, so only apps that start the module compile it (not
 * the CLI or the testing kit), and through `loadOptionalPeer` so that the CommonJS build requires
 * it (Jest's CommonJS runtime refuses a real import()).
 */
export async function loadStatementClassifier(cache?: ClassifierCacheOptions): Promise<StatementClassifier> {
  const parser = await loadOptionalPeer<typeof LibPgQuery>('libpg-query');
  await parser.loadModule();
  return new StatementClassifier((sql) => parser.parseSync(sql) as ParseTree, cache);
}

/** One top-level statement of a string. */
function classifyStatement(node: Record<string, unknown>): Finding {
  const [type, value] = Object.entries(node)[0] ?? ['unknown', {}];
  const body = record(value);
  const kind = kindOf(type);
  const session = SESSION_COMMANDS[type];
  if (session) return { effect: 'read', kind, tables: [], reason: session };
  const hidden = HIDDEN_EFFECTS[type];
  if (hidden) return { effect: 'undecided', kind, tables: [], reason: hidden(body) };
  switch (type) {
    case 'SelectStmt':
    case 'InsertStmt':
    case 'UpdateStmt':
    case 'DeleteStmt':
    case 'MergeStmt':
    case 'DeclareCursorStmt':
      return classifyQuery(kind, node);
    case 'PrepareStmt': {
      // PREPARE runs nothing, but its EXECUTE shows only a name: a prepared write is the write,
      // refused (strict) before anything runs rather than let through as an undecided EXECUTE.
      const prepared = classifyQuery(kindOf(firstType(body.query)), record(body.query));
      if (prepared.effect !== 'write') {
        return read(
          kind,
          'prepares a statement and runs nothing (PREPARE): its EXECUTE is classified when sent',
        );
      }
      return { ...prepared, kind, reason: `prepares a statement that ${prepared.reason} when executed` };
    }
    case 'ExplainStmt':
      // EXPLAIN ANALYZE runs its statement; a plain EXPLAIN only plans it.
      return analyzes(body)
        ? classifyQuery(kind, record(body.query))
        : {
            effect: 'read',
            kind,
            tables: [],
            reason: 'plans its statement and runs nothing (EXPLAIN without ANALYZE)',
          };
    case 'CopyStmt':
      if (body.is_from) {
        return {
          effect: 'write',
          kind: 'COPY FROM',
          tables: [table(body.relation)],
          reason: `loads rows into ${quoted(table(body.relation))} (COPY FROM)`,
        };
      }
      // COPY (query) TO runs its query, which may be a DML with RETURNING.
      return body.query ? classifyQuery(kind, record(body.query)) : read(kind, 'reads a table out (COPY TO)');
    case 'CreateTableAsStmt': {
      const into = table(record(body.into).rel);
      return { effect: 'write', kind, tables: [into], reason: `creates ${quoted(into)} (${kind})` };
    }
    case 'TruncateStmt': {
      const tables = list(body.relations).map((relation) => table(record(relation).RangeVar));
      return { effect: 'write', kind, tables, reason: `empties ${tables.map(quoted).join(', ')} (TRUNCATE)` };
    }
    case 'NotifyStmt':
      // PostgreSQL sends a NOTIFY even read-only: not a write, yet an effect outside the claim.
      return {
        effect: 'undecided',
        kind,
        tables: [],
        reason:
          'writes no table but is delivered when its own transaction commits (NOTIFY), whatever becomes of the claim',
      };
    default: {
      // DDL, GRANT, VACUUM and every other utility: they change the database and commit on their own.
      const tables = body.relation ? [table(body.relation)] : [];
      return { effect: 'write', kind, tables, reason: `changes the database's schema or state (${kind})` };
    }
  }
}

/**
 * A query: a write if a data-modifying statement sits anywhere in it (a WITH's, COPY's, its own)
 * or it is a SELECT INTO; else undecided if it calls a function not known to change nothing; else
 * a read (FOR UPDATE/SHARE included: a lock, not a write).
 */
function classifyQuery(kind: string, root: Record<string, unknown>): Finding {
  const tables: WrittenTable[] = [];
  let firstWrite: string | undefined;
  let locks = false;
  let sequences: string | undefined;
  const unknownFunctions = new Set<string>();
  // Depth first in the text's order, so that the first table named is the first one written.
  const visit = (value: unknown): void => {
    if (Array.isArray(value)) {
      for (const item of value) visit(item);
      return;
    }
    if (value === null || typeof value !== 'object') return;
    for (const [key, child] of Object.entries(value)) {
      const dml = DML[key];
      if (dml) {
        firstWrite ??= dml;
        tables.push(table(record(child).relation));
      } else if (key === 'intoClause') {
        firstWrite ??= 'SELECT INTO';
        tables.push(table(record(child).rel));
      } else if (key === 'lockingClause') {
        locks = true;
      } else if (key === 'FuncCall') {
        const name = funcName(record(child));
        const bare = name.replace(/^pg_catalog\./, '');
        if (SEQUENCE_FUNCTIONS.has(bare)) sequences ??= bare;
        else if (!READ_ONLY_FUNCTIONS.has(bare) && !VOLATILE_READ_ONLY_FUNCTIONS.has(bare)) {
          unknownFunctions.add(name);
        }
      }
      visit(child);
    }
  };
  visit(root);
  if (firstWrite) {
    const written = dedupe(tables);
    const where = written.map(quoted).join(', ');
    const reason =
      firstWrite === 'SELECT INTO'
        ? `creates ${where} (SELECT INTO)`
        : firstWrite === kind || kind === 'EXPLAIN'
          ? `writes ${where}`
          : `writes ${where} in a data-modifying WITH (${firstWrite})`;
    return { effect: 'write', kind: kind === 'EXPLAIN' ? 'EXPLAIN ANALYZE' : kind, tables: written, reason };
  }
  if (unknownFunctions.size > 0) {
    const names = [...unknownFunctions].map((name) => `${name}()`).join(', ');
    return {
      effect: 'undecided',
      kind,
      tables: [],
      reason: `calls ${names}, not one of the built-ins known to change nothing: whether it writes is in its body, not in this text`,
    };
  }
  if (sequences) {
    return read(
      kind,
      `calls ${sequences}(), which changes a sequence no rollback undoes on any connection: not a write the claim's transaction could hold back`,
    );
  }
  return read(kind, locks ? 'reads and locks rows (FOR UPDATE/SHARE): a lock, not a write' : 'reads');
}

function read(kind: string, reason: string): Finding {
  return { effect: 'read', kind, tables: [], reason };
}

/** True for EXPLAIN (ANALYZE) and EXPLAIN ANALYZE, not for EXPLAIN (ANALYZE false) or (ANALYZE 0). */
function analyzes(body: Record<string, unknown>): boolean {
  return list(body.options).some((option) => {
    const element = record(record(option).DefElem);
    if (element.defname !== 'analyze') return false;
    if (element.arg === undefined) return true;
    // The tree leaves out a field at its default: a false boolean, a zero integer.
    const arg = record(element.arg);
    if ('Boolean' in arg) return record(arg.Boolean).boolval === true;
    if ('Integer' in arg) return (record(arg.Integer).ival ?? 0) !== 0;
    return !['false', 'off', 'no', '0'].includes(String(record(arg.String).sval).toLowerCase());
  });
}

/** The node type of a statement node (`InsertStmt` of `{ InsertStmt: {...} }`). */
function firstType(node: unknown): string {
  return Object.keys(record(node))[0] ?? 'unknown';
}

/** `INSERT` for InsertStmt, `ALTER TABLE` for AlterTableStmt. */
function kindOf(type: string): string {
  return (
    KINDS[type] ??
    type
      .replace(/Stmt$/, '')
      .replace(/([a-z])([A-Z])/g, '$1 $2')
      .toUpperCase()
  );
}

/** `app.touch` from a FuncCall's name parts. */
function funcName(call: Record<string, unknown>): string {
  return list(call.funcname)
    .map((part) => String(record(record(part).String).sval ?? '?'))
    .join('.');
}

/** A RangeVar's table. */
function table(rangeVar: unknown): WrittenTable {
  const { schemaname, relname } = record(rangeVar) as { schemaname?: string; relname?: string };
  return schemaname ? { schema: schemaname, name: relname ?? '?' } : { name: relname ?? '?' };
}

/** `"orders"`, `"app"."orders"`: as SQL quotes them. */
export function quoted(written: WrittenTable): string {
  const quote = (name: string) => `"${name.replace(/"/g, '""')}"`;
  return written.schema ? `${quote(written.schema)}.${quote(written.name)}` : quote(written.name);
}

function dedupe(tables: WrittenTable[]): WrittenTable[] {
  const byName = new Map<string, WrittenTable>();
  for (const written of tables) if (!byName.has(quoted(written))) byName.set(quoted(written), written);
  return [...byName.values()];
}

function record(value: unknown): Record<string, unknown> {
  return value !== null && typeof value === 'object' ? (value as Record<string, unknown>) : {};
}

function list(value: unknown): unknown[] {
  return Array.isArray(value) ? value : [];
}
