import type { QueryResult } from 'pg';
import type { DataSource } from 'typeorm';
import type { SqlExecutor } from '../core/claim-strategy.js';
import { pgPoolOf } from './typeorm-internals.js';

/**
 * SQL on the DataSource's own pg pool, autocommitted, in the shape pg-boss takes as its `db`: the
 * handoff's fetches, completions and maintenance share the app's pool and its connection
 * settings instead of opening a pool of their own. A statement sent without values goes as a
 * simple query, which pg-boss's multi-statement migrations need.
 */
export function poolExecutor(dataSource: DataSource): SqlExecutor {
  return {
    executeSql(text: string, values?: unknown[]): Promise<QueryResult> {
      const pool = pgPoolOf(dataSource);
      return values === undefined ? pool.query(text) : pool.query(text, values);
    },
  };
}
