import { randomBytes, randomUUID } from 'node:crypto';
import pg from 'pg';
import { DEFAULTS } from '../../lib/idempotency.constants.js';
import { claimAfterSql, type ClaimStatements } from '../../lib/postgres/claim.sql.js';
import { orderedClaimTypes } from '../../lib/postgres/ordered-claim.sql.js';
import { claimQuery, type ClaimStatement } from '../../lib/postgres/statement-executor.js';
import { round, summarize, type LatencySummary } from '../load/percentiles.js';
import { filledEntity, NEWER_THAN_FILLED } from './versions.js';

/**
 * The claim modes measured: the library's own statements, as its strategies send them.
 * `ordered` is transaction mode with the ordering guard: the ordered claim, on an entity of the
 * versions fill (an update of its version once the table is filled).
 */
export type ClaimMode = 'transaction' | 'ordered' | 'external';

/** The ordering guard's claim and the entities it picks from. */
export interface OrderedClaims {
  statement: ClaimStatement;
  entities: number;
}

/** One claim mode's throughput for new keys. */
export interface ClaimThroughput {
  mode: ClaimMode;
  clients: number;
  seconds: number;
  claims: number;
  claimsPerSecond: number;
  /** Per claim: BEGIN + claim and COMMIT, or the lease claim and its fenced completion. */
  latencyMs: LatencySummary;
  /** Claims that did not answer as a new key should (0 expected). */
  failures: number;
}

const LOCK_TIMEOUT = `${DEFAULTS.concurrentDuplicateWaitMs}ms`;
/** Versions the ordered claims send, each newer than the last. */
let versionCounter = 0;
const SCOPES: Record<ClaimMode, { scope: string; source: string }> = {
  transaction: { scope: 'bench:scale-transaction', source: 'stripe' },
  ordered: { scope: 'bench:scale-ordered', source: 'stripe' },
  external: { scope: 'bench:scale-external', source: 'stripe' },
};

/**
 * `clients` connections claiming new keys for `seconds`, each one claim after another, with the
 * statements the library sends per delivery (prepared, its default):
 * transaction mode `BEGIN; EXECUTE idempotency_transaction_claim(...)` in one round trip, then
 * `COMMIT` (no handler work in between); external mode the lease claim, then the fenced
 * completion. The database's cost of a claim at this table size, without an app in front.
 */
async function runClaims(
  url: string,
  statements: ClaimStatements,
  mode: ClaimMode,
  clients: number,
  seconds: number,
  ordered: OrderedClaims,
): Promise<{ latencies: number[]; failures: number; elapsedS: number }> {
  const connections = await Promise.all(
    Array.from({ length: clients }, async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      return client;
    }),
  );
  const tag = randomBytes(4).toString('hex');
  const latencies: number[] = [];
  let failures = 0;
  const began = performance.now();
  const deadline = began + seconds * 1000;
  try {
    await Promise.all(
      connections.map(async (client, index) => {
        const { scope, source } = SCOPES[mode];
        let prepared = false;
        for (let n = 0; performance.now() < deadline; n++) {
          const key = `evt_${tag}${index.toString(36)}${n.toString(36).padStart(12, '0')}`;
          const start = performance.now();
          if (mode === 'transaction' || mode === 'ordered') {
            const values = [scope, key, source, LOCK_TIMEOUT];
            if (mode === 'ordered') {
              const pick = filledEntity(1 + Math.floor(Math.random() * ordered.entities));
              values.push(pick.scope, pick.entity, String(NEWER_THAN_FILLED + (versionCounter += 1)));
            }
            const literals = values.map((value) => client.escapeLiteral(value));
            const how = prepared ? 'execute' : 'prepare-and-execute';
            const sql =
              mode === 'ordered'
                ? claimAfterSql(
                    statements,
                    'BEGIN',
                    literals,
                    how,
                    ordered.statement,
                    orderedClaimTypes(false),
                  )
                : claimAfterSql(statements, 'BEGIN', literals, how);
            const results = (await client.query(sql)) as unknown as pg.QueryResult[];
            prepared = true;
            if (results.at(-1)?.rows[0]?.claimed !== true) failures++;
            await client.query('COMMIT');
          } else {
            const token = randomUUID();
            const claimed = await client.query(
              claimQuery(
                statements.leaseClaim,
                [scope, key, source, token, DEFAULTS.leaseMs, '5000ms'],
                true,
              ),
            );
            if (claimed.rows[0]?.claimed !== true) failures++;
            const completed = await client.query(
              claimQuery(statements.leaseComplete, [scope, key, token], true),
            );
            if (completed.rowCount !== 1) failures++;
          }
          latencies.push(performance.now() - start);
        }
      }),
    );
  } finally {
    await Promise.all(connections.map((client) => client.end()));
  }
  return { latencies, failures, elapsedS: (performance.now() - began) / 1000 };
}

/**
 * Every mode, alternating in two halves each (transaction, ordered, external, then back), so
 * drift on a shared machine falls on all; the halves are summed.
 */
export async function measureBothModes(
  url: string,
  statements: ClaimStatements,
  clients: number,
  seconds: number,
  ordered: OrderedClaims,
): Promise<ClaimThroughput[]> {
  const runs: Record<ClaimMode, { latencies: number[]; failures: number; elapsedS: number }> = {
    transaction: { latencies: [], failures: 0, elapsedS: 0 },
    ordered: { latencies: [], failures: 0, elapsedS: 0 },
    external: { latencies: [], failures: 0, elapsedS: 0 },
  };
  for (const mode of ['transaction', 'ordered', 'external', 'external', 'ordered', 'transaction'] as const) {
    const half = await runClaims(url, statements, mode, clients, seconds / 2, ordered);
    runs[mode].latencies.push(...half.latencies);
    runs[mode].failures += half.failures;
    runs[mode].elapsedS += half.elapsedS;
  }
  return (['transaction', 'ordered', 'external'] as const).map((mode) => {
    const { latencies, failures, elapsedS } = runs[mode];
    return {
      mode,
      clients,
      seconds: round(elapsedS, 2),
      claims: latencies.length,
      claimsPerSecond: Math.round(latencies.length / elapsedS),
      latencyMs: summarize(latencies),
      failures,
    };
  });
}
