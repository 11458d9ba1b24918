import type { PoolClient } from 'pg';
import { processWide } from '../core/process-wide.js';

/**
 * What this process believes each pool connection's session has prepared, by statement name (a
 * claim per claims table, the statements sent with a COMMIT), learnt from the answers of the
 * queries that PREPAREd or missed there: the claim's rounds (claim-rounds.ts) and the COMMIT's
 * batch (commit-batch.ts) read it to choose between PREPARE and EXECUTE, and correct it when a
 * session turns out other than believed (a transaction-mode pooler, DEALLOCATE ALL). A pool's
 * connections outlive any one module, and both builds of the library may use one pool (see
 * processWide).
 */
const preparedConnections = processWide('prepared-connections', () => new WeakMap<PoolClient, Set<string>>());

/** True when `client`'s session is believed to have prepared `name`. */
export function preparedOnClient(client: PoolClient, name: string): boolean {
  return preparedConnections.get(client)?.has(name) === true;
}

/** Which of `names` the session behind `client` has prepared: one read of pg_prepared_statements. */
export async function preparedOn(client: PoolClient, names: Iterable<string>): Promise<Set<string>> {
  const { rows } = await client.query<{ name: string }>(
    'SELECT name FROM pg_prepared_statements WHERE name = ANY($1)',
    [[...names]],
  );
  return new Set(rows.map((row) => row.name));
}

/** Records what `client` has prepared under `name`, as learnt from an answer. */
export function remember(client: PoolClient, name: string, prepared: boolean): void {
  let names = preparedConnections.get(client);
  if (!names) preparedConnections.set(client, (names = new Set()));
  if (prepared) names.add(name);
  else names.delete(name);
}

/** Asks the connection which of `names` it has prepared (after a query that failed part-way). */
export async function relearnPrepared(client: PoolClient, names: Set<string>): Promise<void> {
  try {
    const found = await preparedOn(client, names);
    for (const name of names) remember(client, name, found.has(name));
  } catch {
    // The connection is gone with what it prepared.
  }
}
