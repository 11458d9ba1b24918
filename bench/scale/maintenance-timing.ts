import type pg from 'pg';
import { DEFAULTS, REPORTER_SCOPE } from '../../lib/idempotency.constants.js';
import { quoteLiteral, type ClaimTable } from '../../lib/postgres/claim-table.js';
import type { MaintenanceStatements } from '../../lib/postgres/maintenance.sql.js';
import { claimTableNames } from '../../lib/postgres/schema.sql.js';
import { round } from '../load/percentiles.js';
import type { ScaleOptions } from './scale-options.js';

/** Leases the reporter reads per run (its MAX_REPORTED_LEASES), and poison events (MAX_POISON_EVENTS). */
const REPORTED_LEASES = 1_000;
const POISON_LIMIT = 100;
/** The name the statements are prepared under while they are timed. */
const PREPARED = 'scale_statement';
/** A statement whose first run takes longer than this is run 3 times per plan mode, not `runs`. */
const SLOW_MS = 1_000;
const SLOW_RUNS = 3;

/** A plan mode: planned for each execution's values, or once for any values. */
export type PlanMode = 'custom' | 'generic';

/**
 * Whose statement it is: the library's (held to the goal), one as it was before this release, or
 * another way of writing one, measured beside it for comparison.
 */
export type StatementRole = 'library' | 'before' | 'alternative';

/** One statement the reporter sends, as it sends it. */
export interface TimedStatement {
  name: string;
  role: StatementRole;
  /** What a `before` or `alternative` statement is. */
  note?: string;
  text: string;
  parameters: (string | number)[];
  /** Changes rows: every run is rolled back, so each finds the same table. */
  writes: boolean;
  /** Sent first in the run's transaction (the reference without the unfinished index drops it). */
  setup?: string;
}

/** One statement under one plan mode, over `runs` runs. */
export interface StatementTiming {
  name: string;
  role: StatementRole;
  note?: string;
  plan: PlanMode;
  runs: number;
  /** EXPLAIN (ANALYZE) of EXECUTE: the server's own execution and planning times. */
  executionMs: { median: number; max: number };
  planningMs: { median: number; max: number };
  /** The plain EXECUTE, timed at the client on loopback: what the reporter waits for. */
  wallMs: { median: number; max: number };
  /** Rows returned or changed (the plain EXECUTE of the last run). */
  rows: number;
  /** Shared buffers the plan touched (hit + read), median: the work done, whatever the noise. */
  pages: number;
  /** The plan's top node and every scan below it, with the index it used. */
  topNode: string;
  scans: string[];
  seqScan: boolean;
}

/** Committed retention batches in a row, as one reporter run sends them. */
export interface RetentionRun {
  statement: 'retention batch' | 'abandoned retention batch' | 'versions retention batch';
  batches: number;
  rowsDeleted: number;
  batchMs: { median: number; max: number };
  /** Rows a second one connection deletes this way, batch after batch. */
  rowsPerSecond: number;
}

/** The statements of `maintenance`, with the reporter's parameters; then the references. */
export function timedStatements(
  table: ClaimTable,
  maintenance: MaintenanceStatements,
  options: ScaleOptions,
): TimedStatement[] {
  const { retentionDays: days, retentionBatchSize: batch, maxAttempts } = options;
  const tickMs = DEFAULTS.reportEveryMs;
  const t = table.sql;
  const cutoff = `now() - $1::double precision * interval '1 day'`;
  const qualify = (name: string) => (table.schema === undefined ? name : `"${table.schema}".${name}`);
  return [
    {
      name: 'tick claim',
      role: 'library',
      text: maintenance.tickClaim,
      parameters: [tickMs],
      writes: true,
    },
    {
      name: 'ticks prune',
      role: 'library',
      text: maintenance.ticksPrune,
      parameters: [],
      writes: true,
    },
    {
      name: 'expired count',
      role: 'library',
      text: maintenance.expiredLeaseCount,
      parameters: [],
      writes: false,
    },
    {
      name: `expired list LIMIT ${REPORTED_LEASES}`,
      role: 'library',
      text: maintenance.expiredLeases,
      parameters: [REPORTED_LEASES],
      writes: false,
    },
    {
      name: `poison LIMIT ${POISON_LIMIT}`,
      role: 'library',
      text: maintenance.poisonEvents,
      parameters: [maxAttempts, POISON_LIMIT],
      writes: false,
    },
    {
      name: `retention batch of ${batch}`,
      role: 'library',
      text: maintenance.retentionBatch,
      parameters: [days],
      writes: true,
    },
    {
      name: `abandoned retention batch of ${batch}`,
      role: 'library',
      text: maintenance.abandonedRetentionBatch,
      parameters: [days],
      writes: true,
    },
    {
      name: `expired list LIMIT ${REPORTED_LEASES} with COUNT(*) OVER ()`,
      role: 'before',
      note: 'the list and its count in one statement: a window over every expired lease',
      text: `
SELECT scope, event_key, source, attempts, claimed_at, lease_expires_at,
       (EXTRACT(EPOCH FROM (now() - lease_expires_at)) * 1000)::bigint AS expired_for_ms,
       COUNT(*) OVER () AS total
FROM ${t}
WHERE status = 'in_progress' AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT $1`,
      parameters: [REPORTED_LEASES],
      writes: false,
    },
    {
      name: `poison LIMIT ${POISON_LIMIT} without the unfinished index`,
      role: 'before',
      note: 'the same query on the table without the unfinished index (dropped in each rolled-back run)',
      text: maintenance.poisonEvents,
      parameters: [maxAttempts, POISON_LIMIT],
      writes: false,
      setup: `DROP INDEX ${qualify(`"${claimTableNames(table).unfinished}"`)}`,
    },
    {
      name: 'ticks prune, the reporter scope as a parameter',
      role: 'before',
      note:
        "the reporter's scope as $1: a generic plan estimates `scope = $1` at a sixth of the table (six " +
        'scopes) and scans the heap',
      text: maintenance.ticksPrune.replace(quoteLiteral(REPORTER_SCOPE), '$1'),
      parameters: [REPORTER_SCOPE],
      writes: true,
    },
    {
      name: `retention batch of ${batch} joined on the primary key, LIMIT as a parameter`,
      role: 'before',
      note:
        'the batch joined back on (scope, event_key), the size as $2: a generic plan estimates `LIMIT $2` ' +
        'at a tenth of the old rows and hash-joins them against a sequential scan',
      text: `
DELETE FROM ${t} AS pe
USING (
  SELECT scope, event_key FROM ${t}
  WHERE status = 'done' AND completed_at < ${cutoff}
  LIMIT $2
) AS old
WHERE pe.scope = old.scope AND pe.event_key = old.event_key AND pe.status = 'done'`,
      parameters: [days, batch],
      writes: true,
    },
    {
      name: `abandoned retention batch of ${batch} through the unfinished index`,
      role: 'before',
      note:
        'failed rows and dead leases found in one pass over the unfinished index (ordered by attempts), ' +
        "reading every unfinished claim's claimed_at, joined back on the primary key",
      text: `
DELETE FROM ${t} AS pe
USING (
  SELECT scope, event_key FROM ${t}
  WHERE status <> 'done' AND scope <> $3
    AND claimed_at < ${cutoff}
    AND (status = 'failed' OR lease_expires_at < now())
  LIMIT $2
) AS old
WHERE pe.scope = old.scope AND pe.event_key = old.event_key AND pe.status <> 'done'
RETURNING pe.scope, pe.event_key, pe.status, pe.attempts`,
      parameters: [days, batch, REPORTER_SCOPE],
      writes: true,
    },
  ];
}

/**
 * Each statement `runs` times under a custom plan and again under a generic one
 * (`plan_cache_mode`), as a SQL-level prepared statement: EXPLAIN (ANALYZE, BUFFERS, TIMING OFF)
 * of its EXECUTE for the server's times and the plan, then the plain EXECUTE timed at the client.
 * A statement slower than a second is run 3 times (its plan is the finding, not its spread).
 * Statements that write run in a transaction that is rolled back, so every run finds the same rows.
 */
export async function timeStatements(
  client: pg.Client,
  statements: TimedStatement[],
  runs: number,
  log: (message: string) => void,
): Promise<StatementTiming[]> {
  const timings: StatementTiming[] = [];
  for (const statement of statements) {
    for (const plan of ['custom', 'generic'] as const) {
      timings.push(await timeOne(client, statement, plan, runs));
      const last = timings.at(-1)!;
      log(
        `${statement.name.padEnd(48)} ${plan.padEnd(7)} exec ${last.executionMs.median} ms (max ${last.executionMs.max}), ` +
          `wall ${last.wallMs.median} ms, ${last.rows} rows, ${last.pages} pages: ${[last.topNode, ...last.scans].join(' ← ')}`,
      );
    }
  }
  return timings;
}

async function timeOne(
  client: pg.Client,
  statement: TimedStatement,
  plan: PlanMode,
  runs: number,
): Promise<StatementTiming> {
  const literals = statement.parameters.map((value) =>
    typeof value === 'number' ? String(value) : client.escapeLiteral(value),
  );
  const execute = `EXECUTE ${PREPARED}${literals.length ? `(${literals.join(', ')})` : ''}`;
  const transactional = statement.writes || statement.setup !== undefined;
  const begin = async () => {
    if (!transactional) return;
    await client.query('BEGIN');
    if (statement.setup) await client.query(statement.setup);
  };
  const end = async () => {
    if (transactional) await client.query('ROLLBACK');
  };
  await client.query(`SET plan_cache_mode = force_${plan}_plan`);
  await client.query(`PREPARE ${PREPARED} AS ${statement.text}`);
  const execution: number[] = [];
  const planning: number[] = [];
  const wall: number[] = [];
  const pages: number[] = [];
  let rows = 0;
  let explained: ExplainedPlan | undefined;
  let planned = runs;
  try {
    for (let run = 0; run < planned; run++) {
      await begin();
      // TIMING OFF: per-node clocks would add their own cost to every row of a big scan; the
      // statement's execution time is still measured.
      const { rows: output } = await client.query(
        `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) ${execute}`,
      );
      explained = (output[0]['QUERY PLAN'] as ExplainedPlan[])[0];
      execution.push(explained['Execution Time']);
      planning.push(explained['Planning Time'] ?? 0);
      pages.push((explained.Plan['Shared Hit Blocks'] ?? 0) + (explained.Plan['Shared Read Blocks'] ?? 0));
      await end();
      await begin();
      const start = performance.now();
      const result = await client.query(execute);
      wall.push(performance.now() - start);
      rows = result.rowCount ?? 0;
      await end();
      if (run === 0 && wall[0] > SLOW_MS) planned = Math.min(runs, SLOW_RUNS);
    }
  } finally {
    if (transactional) await client.query('ROLLBACK').catch(() => undefined);
    await client.query(`DEALLOCATE ${PREPARED}`);
    await client.query('RESET plan_cache_mode');
  }
  const scans = scansOf(explained!.Plan);
  return {
    name: statement.name,
    role: statement.role,
    ...(statement.note && { note: statement.note }),
    plan,
    runs: wall.length,
    executionMs: medianMax(execution),
    planningMs: medianMax(planning),
    wallMs: medianMax(wall),
    rows,
    pages: Math.round(medianMax(pages).median),
    topNode: nodeName(explained!.Plan),
    scans,
    seqScan: scans.some((scan) => scan.startsWith('Seq Scan')),
  };
}

/**
 * `runs` committed batches in a row of a retention statement, unnamed with parameters as the
 * reporter sends them, stopping at the first short batch (nothing more to delete).
 */
export async function runRetention(
  client: pg.Client,
  statement: RetentionRun['statement'],
  text: string,
  parameters: unknown[],
  batchSize: number,
  runs: number,
): Promise<RetentionRun> {
  const times: number[] = [];
  let rowsDeleted = 0;
  for (let batch = 0; batch < runs; batch++) {
    const start = performance.now();
    const result = await client.query(text, parameters);
    times.push(performance.now() - start);
    rowsDeleted += result.rowCount ?? 0;
    if ((result.rowCount ?? 0) < batchSize) break;
  }
  const totalS = times.reduce((sum, ms) => sum + ms, 0) / 1000;
  return {
    statement,
    batches: times.length,
    rowsDeleted,
    batchMs: medianMax(times),
    rowsPerSecond: totalS > 0 ? Math.round(rowsDeleted / totalS) : 0,
  };
}

/** The parts of EXPLAIN (FORMAT JSON) read here. */
interface PlanNode {
  'Node Type': string;
  Operation?: string;
  'Relation Name'?: string;
  'Index Name'?: string;
  'Heap Fetches'?: number;
  'Shared Hit Blocks'?: number;
  'Shared Read Blocks'?: number;
  Plans?: PlanNode[];
}

interface ExplainedPlan {
  Plan: PlanNode;
  'Planning Time'?: number;
  'Execution Time': number;
}

function nodeName(node: PlanNode): string {
  return node['Node Type'] === 'ModifyTable' && node.Operation ? `${node.Operation}` : node['Node Type'];
}

/** Every scan in the plan: `Index Only Scan using processed_events_expiring_idx (12 heap fetches)`. */
function scansOf(node: PlanNode, found: string[] = []): string[] {
  if (node['Index Name']) {
    const fetches = node['Heap Fetches'] === undefined ? '' : ` (${node['Heap Fetches']} heap fetches)`;
    found.push(`${node['Node Type']} using ${node['Index Name']}${fetches}`);
  } else if (node['Node Type'].endsWith('Scan') && node['Relation Name']) {
    found.push(`${node['Node Type']} on ${node['Relation Name']}`);
  }
  for (const child of node.Plans ?? []) scansOf(child, found);
  return found;
}

function medianMax(values: number[]): { median: number; max: number } {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  const median = sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
  return { median: round(median, 3), max: round(sorted.at(-1) ?? 0, 3) };
}
