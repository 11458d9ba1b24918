const badTableOption = (option: string, value: unknown, expected: string) =>
  `IdempotencyModule option ${option} must be ${expected}, got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

/** The default name of the claims table. */
export const DEFAULT_TABLE = 'processed_events';

/** The claims table every statement names, resolved once per module. */
export interface ClaimTable {
  /** The schema, or undefined for the connection's search_path. */
  readonly schema: string | undefined;
  /** The table's name. */
  readonly name: string;
  /** The table as SQL: `"processed_events"` or `"billing"."webhook_claims"`, quoted. */
  readonly sql: string;
  /** The table as `to_regclass()` takes it, for the boot check. */
  readonly regclass: string;
  /** Prefix of the table's constraint and index names: the table name. */
  readonly indexPrefix: string;
}

/** PostgreSQL truncates identifiers to 63 bytes; a truncated name would silently differ. */
const MAX_IDENTIFIER_BYTES = 63;

/** A double-quoted identifier, with embedded quotes doubled. */
export function quoteIdentifier(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/** A single-quoted SQL string literal, with embedded quotes doubled (standard_conforming_strings). */
export function quoteLiteral(value: string): string {
  return `'${value.replace(/'/g, "''")}'`;
}

/** Resolves the table options; a name PostgreSQL would truncate or refuse fails the boot. */
export function claimTable(schema: string | undefined, name: string = DEFAULT_TABLE): ClaimTable {
  for (const [option, value] of [
    ['table', name],
    ['schema', schema],
  ] as const) {
    if (value === undefined && option === 'schema') continue;
    if (typeof value !== 'string' || value.length === 0)
      throw new Error(badTableOption(option, value, 'a non-empty string'));
    // The index names append up to 15 characters to the table name.
    const limit =
      option === 'table' ? MAX_IDENTIFIER_BYTES - '_retention_idx'.length - 2 : MAX_IDENTIFIER_BYTES;
    if (Buffer.byteLength(value) > limit)
      throw new Error(badTableOption(option, value, `at most ${limit} bytes`));
    if (value.includes('\u0000')) throw new Error(badTableOption(option, value, 'without NUL characters'));
  }
  const sql =
    schema === undefined ? quoteIdentifier(name) : `${quoteIdentifier(schema)}.${quoteIdentifier(name)}`;
  return { schema, name, sql, regclass: sql, indexPrefix: name };
}
