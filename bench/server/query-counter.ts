import pg from 'pg';

/** What the bench server's pg clients sent since the last reset. */
export interface QueryCounts {
  /** `Client.query()` calls: node-postgres sends one and waits for its answer before the next. */
  queries: number;
  /** SQL statements in those calls (a multi-statement simple query counts each). */
  statements: number;
  /** ReadyForQuery messages received: the server's end of each round trip, counted on the wire. */
  readyForQuery: number;
  /** New connections opened (each costs start-up round trips of its own; zero on a warm pool). */
  connects: number;
}

/** One statement as sent, for the per-request traces. */
export interface TracedQuery {
  sql: string;
  parameters: number;
}

const counts: QueryCounts = { queries: 0, statements: 0, readyForQuery: 0, connects: 0 };
let trace: TracedQuery[] | undefined;

/**
 * Statements in one query text: one plus every semicolon with more SQL after it. The bench's and
 * the library's SQL has no semicolons inside literals. Runs on every query of every variant: a
 * text without a semicolon costs one indexOf, where a split and filter would allocate for every
 * query.
 */
function statementsIn(text: string): number {
  let statements = 1;
  for (let at = text.indexOf(';'); at !== -1; at = text.indexOf(';', at + 1)) {
    if (text.slice(at + 1).trim().length > 0) statements++;
  }
  return statements;
}

/** First line of a statement, whitespace collapsed: enough to recognise it in a trace. */
function summary(text: string): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length > 120 ? `${flat.slice(0, 117)}...` : flat;
}

/**
 * Counts what every pg client of this process sends, below TypeORM and the library, so the
 * library's queries and the hand-written ones are counted by the same code. Wraps
 * `Client.prototype.query` (statements, requests) and `_handleReadyForQuery` (round trips as seen
 * on the wire; node-postgres binds it at connect time, so install before the pool opens).
 */
export function installQueryCounter(): void {
  const proto = pg.Client.prototype as any;
  const query = proto.query;
  proto.query = function countedQuery(this: unknown, config: any, ...rest: unknown[]) {
    const text: string = typeof config === 'string' ? config : (config?.text ?? '');
    const values = Array.isArray(rest[0]) ? rest[0] : (config?.values ?? []);
    counts.queries++;
    counts.statements += statementsIn(text);
    trace?.push({ sql: summary(text), parameters: values.length });
    return query.call(this, config, ...rest);
  };
  const readyForQuery = proto._handleReadyForQuery;
  proto._handleReadyForQuery = function countedReadyForQuery(
    this: { _connecting?: boolean },
    ...args: unknown[]
  ) {
    // The first ReadyForQuery of a connection ends its start-up, not a query.
    if (this._connecting) counts.connects++;
    else counts.readyForQuery++;
    return readyForQuery.apply(this, args);
  };
}

/** Counts since the last reset. */
export function queryCounts(): QueryCounts {
  return { ...counts };
}

/** Starts a new counting window. */
export function resetQueryCounts(): void {
  counts.queries = 0;
  counts.statements = 0;
  counts.readyForQuery = 0;
  counts.connects = 0;
}

/** Records every statement sent until stopTrace(). */
export function startTrace(): void {
  trace = [];
}

/** The statements sent since startTrace(). */
export function stopTrace(): TracedQuery[] {
  const recorded = trace ?? [];
  trace = undefined;
  return recorded;
}
