import type pg from 'pg';
import { REPORTER_SCOPE } from '../../lib/idempotency.constants.js';
import type { ClaimTable } from '../../lib/postgres/claim-table.js';
import type { ScaleOptions } from './scale-options.js';

/** Leases held right now by live workers: a few dozen at any time. */
export const LIVE_LEASES = 100;
/** The reporter's tick rows: one a minute for the last day, and an hour's worth older (to prune). */
const TICK_ROWS = 24 * 60 + 60;
/** One claim in 5,000 is a failed attempt (a handler that threw, either mode). */
const FAILED_EVERY = 5_000;

/**
 * The shape of the fill, for the report: shares of the done rows and what the rest are.
 */
export const FILL_SHAPE = {
  externalShare: 0.3,
  failedEvery: FAILED_EVERY,
  liveLeases: LIVE_LEASES,
  tickRows: TICK_ROWS,
  description:
    'done rows over the whole span (70% transaction mode: claimed and completed at once, no token; ' +
    '30% external: a lease token, a 5-minute lease, completed 20-520 ms after the claim, 2% of them ' +
    'on a second attempt); one row in 5,000 a failed attempt (both modes; 80% with 1-4 attempts, 20% ' +
    'with 5-12: poison); expired leases (in progress, their lease over, 5% of them with 5-8 ' +
    'attempts), spread over the span; 100 live leases claimed in the last minute (10 minutes left); the ' +
    "reporter's tick rows, one a minute for a day and an hour older. Keys are Stripe-shaped " +
    '(`evt_` + 24 hex characters, random order: the primary key is filled as real traffic fills it), ' +
    'five scopes.',
};

/**
 * Rows `from`..`to` of the fill, in time order, as one INSERT ... SELECT generate_series.
 * $1 from, $2 to, $3 rows in the span, $4 days, $5 one expired lease every $5 rows (0: none),
 * $6 one failed row every $6 rows, $7 the anchor (now, at the start of the fill).
 */
function spanChunkSql(table: ClaimTable): string {
  return `
WITH spread AS (
  SELECT i,
         CASE WHEN i % NULLIF($5::bigint, 0) = 0 THEN 'expired'
              WHEN i % $6::bigint = 1 THEN 'failed'
              ELSE 'done' END AS kind,
         (i % 10) < 3 AS external,
         $7::timestamptz - $4::double precision * interval '1 day'
           + (i::double precision / $3::bigint) * $4::double precision * interval '1 day' AS t
  FROM generate_series($1::bigint, $2::bigint) AS i
), shaped AS (
  SELECT i, kind, t, kind = 'expired' OR external AS leased,
         CASE kind
           WHEN 'expired' THEN CASE WHEN (i / $5::bigint) % 20 = 0 THEN 5 + (i / $5::bigint) % 4
                                    ELSE 1 + (i / $5::bigint) % 3 END
           WHEN 'failed' THEN CASE WHEN (i / $6::bigint) % 10 < 8 THEN 1 + (i / $6::bigint) % 4
                                   ELSE 5 + (i / $6::bigint) % 8 END
           ELSE CASE WHEN external AND i % 50 = 0 THEN 2 ELSE 1 END
         END AS attempts
  FROM spread
)
INSERT INTO ${table.sql}
  (scope, event_key, source, status, attempts, lease_token, claimed_at, lease_expires_at, completed_at, last_error)
SELECT
  CASE WHEN leased THEN (ARRAY['stripe:fulfilment', 'mail:receipts'])[1 + i % 2]
       ELSE (ARRAY['stripe:orders', 'github:deployments', 'shopify:orders-paid'])[1 + i % 3] END,
  'evt_' || substr(md5('fill' || i), 1, 24),
  CASE WHEN leased THEN (ARRAY['stripe', 'mail'])[1 + i % 2]
       ELSE (ARRAY['stripe', 'github', 'shopify'])[1 + i % 3] END,
  CASE kind WHEN 'expired' THEN 'in_progress' ELSE kind END,
  attempts,
  CASE WHEN leased THEN md5('token' || i)::uuid END,
  CASE WHEN kind = 'expired' THEN t - interval '10 minutes' ELSE t END,
  CASE WHEN kind = 'expired' THEN t - interval '5 minutes' WHEN leased THEN t + interval '5 minutes' END,
  CASE WHEN kind = 'done' THEN CASE WHEN leased THEN t + (20 + i % 500) * interval '1 millisecond' ELSE t END END,
  CASE WHEN kind = 'failed' THEN 'Error: downstream answered 503 Service Unavailable (attempt ' || attempts || ')' END
FROM shaped`;
}

/**
 * Leases held by live workers, claimed in the last minute, inserted once the fill is over: with 10
 * minutes left (a heartbeat renews them), they are still live when the statements are measured.
 * $1 how many.
 */
function liveLeasesSql(table: ClaimTable): string {
  return `
INSERT INTO ${table.sql}
  (scope, event_key, source, status, attempts, lease_token, claimed_at, lease_expires_at)
SELECT (ARRAY['stripe:fulfilment', 'mail:receipts'])[1 + i % 2], 'evt_' || substr(md5('live' || i), 1, 24),
       (ARRAY['stripe', 'mail'])[1 + i % 2], 'in_progress', 1, md5('live-token' || i)::uuid,
       now() - (i % 60) * interval '1 second', now() + interval '10 minutes'
FROM generate_series(1, $1::int) AS i`;
}

/** The reporter's tick claims, one a minute back from the anchor. $1 anchor, $2 reporter scope, $3 how many. */
function ticksSql(table: ClaimTable): string {
  return `
INSERT INTO ${table.sql} (scope, event_key, source, status, claimed_at, completed_at)
SELECT $2, (FLOOR(EXTRACT(EPOCH FROM $1::timestamptz) / 60)::bigint - i)::text, 'idempotency', 'done',
       $1::timestamptz - i * interval '1 minute', $1::timestamptz - i * interval '1 minute'
FROM generate_series(0, $3::int - 1) AS i`;
}

/** What the fill did. */
export interface FillResult {
  rows: number;
  seconds: number;
  rowsPerSecond: number;
  vacuumSeconds: number;
}

/**
 * Fills the (empty, migrated) claims table with `options.rows` rows shaped like `options.days`
 * days of traffic, in INSERTs of `options.chunkRows` rows, each committed, with progress on the
 * console; then VACUUM (ANALYZE), as autovacuum would have left a table this old.
 */
export async function fillClaimsTable(
  client: pg.Client,
  table: ClaimTable,
  options: ScaleOptions,
  log: (message: string) => void,
): Promise<FillResult> {
  const began = performance.now();
  const {
    rows: [{ anchor }],
  } = await client.query<{ anchor: string }>('SELECT now()::text AS anchor');
  const span = options.rows - LIVE_LEASES - TICK_ROWS;
  const expiredEvery = Math.floor(span / options.expired[0]);
  await client.query(ticksSql(table), [anchor, REPORTER_SCOPE, TICK_ROWS]);
  const sql = spanChunkSql(table);
  let lastLog = 0;
  for (let from = 1; from <= span; from += options.chunkRows) {
    const to = Math.min(span, from + options.chunkRows - 1);
    await client.query(sql, [from, to, span, options.days, expiredEvery, FAILED_EVERY, anchor]);
    const seconds = (performance.now() - began) / 1000;
    if (performance.now() - lastLog > 5_000 || to === span) {
      lastLog = performance.now();
      const rate = to / seconds;
      log(
        `fill ${(to / 1e6).toFixed(2)}M / ${(span / 1e6).toFixed(2)}M rows (${((to / span) * 100).toFixed(1)}%), ` +
          `${Math.round(rate / 1000)}k rows/s, about ${formatSeconds((span - to) / rate)} left`,
      );
    }
  }
  await client.query(liveLeasesSql(table), [LIVE_LEASES]);
  const filled = (performance.now() - began) / 1000;
  log(`filled ${options.rows} rows in ${formatSeconds(filled)}; VACUUM (ANALYZE)`);
  const vacuumBegan = performance.now();
  await client.query(`VACUUM (ANALYZE) ${table.sql}`);
  const vacuumSeconds = (performance.now() - vacuumBegan) / 1000;
  return {
    rows: options.rows,
    seconds: Math.round(filled * 10) / 10,
    rowsPerSecond: Math.round(options.rows / filled),
    vacuumSeconds: Math.round(vacuumSeconds * 10) / 10,
  };
}

/**
 * Adds `count` expired leases spread over the span (a heavier case of workers dying), then
 * VACUUM (ANALYZE). $1 count, $2 days, $3 tag (keeps the keys of each addition apart).
 */
export async function addExpiredLeases(
  client: pg.Client,
  table: ClaimTable,
  count: number,
  options: ScaleOptions,
): Promise<void> {
  if (count <= 0) return;
  await client.query(
    `
INSERT INTO ${table.sql}
  (scope, event_key, source, status, attempts, lease_token, claimed_at, lease_expires_at)
SELECT (ARRAY['stripe:fulfilment', 'mail:receipts'])[1 + i % 2], 'evt_' || substr(md5($3 || i), 1, 24),
       (ARRAY['stripe', 'mail'])[1 + i % 2], 'in_progress', 1 + i % 3, md5($3 || 'token' || i)::uuid,
       t - interval '10 minutes', t - interval '5 minutes'
FROM (
  SELECT i, now() - $2::double precision * interval '1 day'
              + (i::double precision / $1::int) * ($2::double precision * interval '1 day' - interval '10 minutes') AS t
  FROM generate_series(1, $1::int) AS i
) AS spread`,
    [count, options.days, `expired-${count}-`],
  );
  await client.query(`VACUUM (ANALYZE) ${table.sql}`);
}

/** The table as the maintenance statements find it. */
export interface TableState {
  heapMb: number;
  indexesMb: Record<string, number>;
  /** Rows by what they are (a full count: a few seconds at 10M rows). */
  composition: Record<string, number>;
  /** Done rows older than retentionDays: what retention has to delete. */
  retentionBacklog: number;
  /** Unfinished rows last claimed before retentionDays, failed or with their lease over: abandoned. */
  abandonedBacklog: number;
  deadTuples: number;
  lastAutovacuum: string | null;
  lastAutoanalyze: string | null;
}

/** Sizes, composition and dead tuples of the table. */
export async function describeTable(
  client: pg.Client,
  table: ClaimTable,
  options: ScaleOptions,
): Promise<TableState> {
  const mb = (bytes: string | number) => Math.round((Number(bytes) / 1024 / 1024) * 10) / 10;
  const { rows: heap } = await client.query(`SELECT pg_relation_size($1::regclass) AS bytes`, [
    table.regclass,
  ]);
  const { rows: indexes } = await client.query(
    `SELECT c.relname AS name, pg_relation_size(c.oid) AS bytes FROM pg_index i
     JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass ORDER BY c.relname`,
    [table.regclass],
  );
  const { rows: kinds } = await client.query(
    `SELECT CASE
              WHEN scope = $1 THEN 'reporter ticks'
              WHEN status = 'done' THEN CASE WHEN lease_token IS NULL THEN 'done, transaction mode'
                                             ELSE 'done, external mode' END
              WHEN status = 'failed' THEN CASE WHEN attempts >= $2 THEN 'failed, poison' ELSE 'failed' END
              WHEN lease_expires_at < now() THEN 'expired leases'
              ELSE 'live leases' END AS kind,
            count(*)::int AS n
     FROM ${table.sql} GROUP BY 1 ORDER BY 2 DESC`,
    [REPORTER_SCOPE, options.maxAttempts],
  );
  const { rows: backlog } = await client.query(
    `SELECT
       (SELECT count(*)::int FROM ${table.sql}
        WHERE status = 'done' AND completed_at < now() - $1::double precision * interval '1 day') AS retention,
       (SELECT count(*)::int FROM ${table.sql}
        WHERE status <> 'done' AND scope <> $2 AND claimed_at < now() - $1::double precision * interval '1 day'
          AND (status = 'failed' OR lease_expires_at < now())) AS abandoned`,
    [options.retentionDays, REPORTER_SCOPE],
  );
  const { rows: activity } = await client.query(
    `SELECT n_dead_tup::int AS dead, last_autovacuum::text AS vacuum, last_autoanalyze::text AS analyze
     FROM pg_stat_user_tables WHERE relid = $1::regclass`,
    [table.regclass],
  );
  return {
    heapMb: mb(heap[0].bytes),
    indexesMb: Object.fromEntries(indexes.map((index) => [index.name, mb(index.bytes)])),
    composition: Object.fromEntries(kinds.map((kind) => [kind.kind, kind.n])),
    retentionBacklog: backlog[0].retention,
    abandonedBacklog: backlog[0].abandoned,
    deadTuples: activity[0]?.dead ?? 0,
    lastAutovacuum: activity[0]?.vacuum ?? null,
    lastAutoanalyze: activity[0]?.analyze ?? null,
  };
}

/** `3m 05s`, `42.1 s`. */
export function formatSeconds(seconds: number): string {
  if (!Number.isFinite(seconds)) return '?';
  if (seconds < 90) return `${seconds.toFixed(1)} s`;
  const minutes = Math.floor(seconds / 60);
  return `${minutes}m ${String(Math.round(seconds - minutes * 60)).padStart(2, '0')}s`;
}
