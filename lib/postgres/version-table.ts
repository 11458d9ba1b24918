import { quoteIdentifier, type ClaimTable } from './claim-table.js';

/**
 * The table the ordering guard keeps its versions in: the newest version applied per (scope,
 * entity). It sits beside the claims table, named after it (`processed_events_versions` by
 * default), so a module with a table of its own (the `schema` and `table` options) has its own.
 */
export interface VersionTable {
  /** The schema, or undefined for the connection's search_path (the claims table's). */
  readonly schema: string | undefined;
  /** The table's name: the claims table's with `_versions`. */
  readonly name: string;
  /** The table as SQL, quoted. */
  readonly sql: string;
  /** The table as `to_regclass()` takes it. */
  readonly regclass: string;
  /** Its primary key, on (scope, entity). */
  readonly primaryKey: string;
  /** Its index on `applied_at`, for retention. */
  readonly retentionIndex: string;
}

/** The suffix of the versions table's name, after the claims table's. */
const SUFFIX = '_versions';

/**
 * The versions table of `claims`. The claims table's name is at most 47 bytes (claimTable), so
 * the longest name here, `<table>_versions_pkey`, stays within PostgreSQL's 63.
 */
export function versionTable(claims: ClaimTable): VersionTable {
  const name = `${claims.name}${SUFFIX}`;
  const sql =
    claims.schema === undefined
      ? quoteIdentifier(name)
      : `${quoteIdentifier(claims.schema)}.${quoteIdentifier(name)}`;
  return {
    schema: claims.schema,
    name,
    sql,
    regclass: sql,
    primaryKey: `${name}_pkey`,
    retentionIndex: `${name}_idx`,
  };
}
