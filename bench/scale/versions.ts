import { createHash } from 'node:crypto';
import type pg from 'pg';
import type { VersionMaintenanceStatements } from '../../lib/postgres/version-maintenance.sql.js';
import type { VersionTable } from '../../lib/postgres/version-table.js';
import { formatSeconds } from './fill.js';
import type { TimedStatement } from './maintenance-timing.js';
import type { ScaleOptions } from './scale-options.js';

/**
 * The ordering guard's versions table at scale: filled with `options.entities` entities (10M by
 * default), one row each, applied over the same days as the claims (so a share of them is older
 * than retentionDays, as retention finds a real table), then its retention statement timed.
 */

/** The guard scopes of the fill: a few handlers' worth. */
export const VERSION_SCOPES = ['stripe:subscriptions', 'shopify:orders', 'paddle:subscriptions'];

/** The entity the fill gives row `i` (also what the ordered claims of the throughput phase update). */
export function filledEntity(i: number): { scope: string; entity: string } {
  const hex = createHash('md5').update(`entity${i}`).digest('hex').slice(0, 24);
  return { scope: VERSION_SCOPES[i % VERSION_SCOPES.length], entity: `sub_${hex}` };
}

/** A version newer than any the fill wrote: seconds since 1970, as Stripe's `created`. */
export const NEWER_THAN_FILLED = 4_000_000_000;

/**
 * Rows `from`..`to` of the fill: entity i at a time spread over `days` up to the anchor, its
 * version that time in seconds. Random entity order, as the primary key fills in real traffic.
 * $1 from, $2 to, $3 rows, $4 days, $5 the anchor.
 */
function versionChunkSql(versions: VersionTable): string {
  return `
INSERT INTO ${versions.sql} (scope, entity, version, applied_at)
SELECT (ARRAY['${VERSION_SCOPES.join("', '")}'])[1 + i % ${VERSION_SCOPES.length}],
       'sub_' || substr(md5('entity' || i), 1, 24),
       floor(extract(epoch FROM t)),
       t
FROM (
  SELECT i, $5::timestamptz - $4::double precision * interval '1 day'
            + (i::double precision / $3::bigint) * $4::double precision * interval '1 day' AS t
  FROM generate_series($1::bigint, $2::bigint) AS i
) AS spread`;
}

/** What the versions fill did, and the table after it. */
export interface VersionsFill {
  entities: number;
  seconds: number;
  rowsPerSecond: number;
  vacuumSeconds: number;
  heapMb: number;
  indexesMb: Record<string, number>;
  /** Versions older than retentionDays: what retention has to delete. */
  retentionBacklog: number;
}

/** Fills the (empty, migrated) versions table, in committed chunks, then VACUUM (ANALYZE). */
export async function fillVersionsTable(
  client: pg.Client,
  versions: VersionTable,
  options: ScaleOptions,
  log: (message: string) => void,
): Promise<VersionsFill> {
  const began = performance.now();
  const {
    rows: [{ anchor }],
  } = await client.query<{ anchor: string }>('SELECT now()::text AS anchor');
  const sql = versionChunkSql(versions);
  let lastLog = 0;
  for (let from = 1; from <= options.entities; from += options.chunkRows) {
    const to = Math.min(options.entities, from + options.chunkRows - 1);
    await client.query(sql, [from, to, options.entities, options.days, anchor]);
    if (performance.now() - lastLog > 5_000 || to === options.entities) {
      lastLog = performance.now();
      const rate = to / ((performance.now() - began) / 1000);
      log(
        `versions fill ${(to / 1e6).toFixed(2)}M / ${(options.entities / 1e6).toFixed(2)}M, ` +
          `${Math.round(rate / 1000)}k rows/s, about ${formatSeconds((options.entities - to) / rate)} left`,
      );
    }
  }
  const filled = (performance.now() - began) / 1000;
  const vacuumBegan = performance.now();
  await client.query(`VACUUM (ANALYZE) ${versions.sql}`);
  const vacuumSeconds = (performance.now() - vacuumBegan) / 1000;
  return {
    entities: options.entities,
    seconds: Math.round(filled * 10) / 10,
    rowsPerSecond: Math.round(options.entities / filled),
    vacuumSeconds: Math.round(vacuumSeconds * 10) / 10,
    ...(await describeVersions(client, versions, options)),
  };
}

/** Sizes and retention backlog of the versions table. */
export async function describeVersions(
  client: pg.Client,
  versions: VersionTable,
  options: ScaleOptions,
): Promise<Pick<VersionsFill, 'heapMb' | 'indexesMb' | 'retentionBacklog'>> {
  const mb = (bytes: string | number) => Math.round((Number(bytes) / 1024 / 1024) * 10) / 10;
  const { rows: heap } = await client.query(`SELECT pg_relation_size($1::regclass) AS bytes`, [
    versions.regclass,
  ]);
  const { rows: indexes } = await client.query(
    `SELECT c.relname AS name, pg_relation_size(c.oid) AS bytes FROM pg_index i
     JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass ORDER BY c.relname`,
    [versions.regclass],
  );
  const { rows: backlog } = await client.query(
    `SELECT count(*)::int AS n FROM ${versions.sql} WHERE applied_at < now() - $1::double precision * interval '1 day'`,
    [options.retentionDays],
  );
  return {
    heapMb: mb(heap[0].bytes),
    indexesMb: Object.fromEntries(indexes.map((index) => [index.name, mb(index.bytes)])),
    retentionBacklog: backlog[0].n,
  };
}

/** The versions table's retention statement as the reporter sends it, and what it replaced. */
export function versionTimedStatements(
  versions: VersionTable,
  statements: VersionMaintenanceStatements,
  options: ScaleOptions,
): TimedStatement[] {
  const cutoff = `now() - $1::double precision * interval '1 day'`;
  return [
    {
      name: `versions retention batch of ${options.retentionBatchSize}`,
      role: 'library',
      text: statements.retentionBatch,
      parameters: [options.retentionDays],
      writes: true,
    },
    {
      name: `versions retention batch of ${options.retentionBatchSize} without ORDER BY`,
      role: 'alternative',
      note: 'the batch without ORDER BY applied_at, which a generic plan may read with a sequential scan',
      text: `
DELETE FROM ${versions.sql} WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM ${versions.sql} WHERE applied_at < ${cutoff} LIMIT ${options.retentionBatchSize}
)) AND applied_at < ${cutoff}`,
      parameters: [options.retentionDays],
      writes: true,
    },
  ];
}
