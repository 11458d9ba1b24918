import type { Pool, PoolClient, QueryConfig, QueryResult } from 'pg';

/*
 * pg's calls on every delivery's path, each as one promise. The promise forms of Pool.connect(),
 * Pool.query() and Client.query() make two each (the second a `.catch` that points the error's
 * stack at the caller), and while AsyncLocalStorage is on every promise pays its hooks. The
 * callbacks here only settle the promise: what follows runs where it is awaited, in the
 * delivery's async context, as after pg's own promises. An error's stack then ends in pg's
 * socket handler; its message and SQLSTATE are the same.
 */

/** `pool.connect()` as one promise. */
export function connectClient(pool: Pool): Promise<PoolClient> {
  return new Promise((resolve, reject) => {
    pool.connect((error, client) => {
      if (client && !error) resolve(client);
      else reject(error ?? new Error('The pool answered connect() with neither a connection nor an error'));
    });
  });
}

/** What sendQuery() sends on: a connection, or the pool (autocommitted on a connection of its own). */
interface Queryable {
  query(query: string | QueryConfig, callback: (error: Error | null, result: QueryResult) => void): void;
}

/**
 * `on.query(query)` as one promise: on a connection, a simple-protocol query (a text without
 * values, its statements answered one result each) or a query with values; on the pool, either,
 * autocommitted.
 */
export function sendQuery(on: Pool | PoolClient, query: string | QueryConfig): Promise<QueryResult> {
  return new Promise((resolve, reject) => {
    (on as Queryable).query(query, (error, result) => (error ? reject(error) : resolve(result)));
  });
}
