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

/** `client.query(text)`, a simple-protocol query without values, as one promise. */
export function sendSimpleQuery(client: PoolClient, text: string): Promise<QueryResult> {
  return new Promise((resolve, reject) => {
    client.query(text, (error: Error | null, result: QueryResult) =>
      error ? reject(error) : resolve(result),
    );
  });
}

/** `pool.query(query)`, autocommitted on a connection of the pool's, as one promise. */
export function sendPoolQuery(pool: Pool, query: QueryConfig): Promise<QueryResult> {
  return new Promise((resolve, reject) => {
    pool.query(query, (error: Error | null, result: QueryResult) =>
      error ? reject(error) : resolve(result),
    );
  });
}
