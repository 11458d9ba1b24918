import type { Pool, QueryConfig } from 'pg';
import type { DataSource } from 'typeorm';

/** A statement of the per-delivery path, with the name pg prepares it under. */
export interface ClaimStatement {
  readonly name: string;
  readonly text: string;
}

/**
 * The pg query for `statement`. Named, pg parses it once per connection and Postgres reuses the
 * plan on every later delivery; unnamed (`prepared: false`), it is parsed and planned each time,
 * which a pooler in transaction mode that does not track prepared statements needs.
 */
export function claimQuery(statement: ClaimStatement, values: unknown[], prepared: boolean): QueryConfig {
  return prepared ? { name: statement.name, text: statement.text, values } : { text: statement.text, values };
}

/**
 * The pg pool under a TypeORM postgres DataSource (its master pool under replication). The claim
 * path talks to pg directly: TypeORM's query() cannot send a named statement.
 */
export function pgPoolOf(dataSource: DataSource): Pool {
  const pool = (dataSource.driver as { master?: Partial<Pool> }).master;
  if (typeof pool?.query !== 'function') {
    throw new Error(
      `IdempotencyModule needs a DataSource on the postgres driver (node-postgres), got type '${dataSource.options.type}'`,
    );
  }
  return pool as Pool;
}
