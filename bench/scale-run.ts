import { loadavg } from 'node:os';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import pg from 'pg';
import * as prettier from 'prettier';
import { claimTable } from '../lib/postgres/claim-table.js';
import { claimStatements } from '../lib/postgres/claim.sql.js';
import { maintenanceStatements } from '../lib/postgres/maintenance.sql.js';
import { orderedClaimStatements } from '../lib/postgres/ordered-claim.sql.js';
import { versionMaintenanceStatements } from '../lib/postgres/version-maintenance.sql.js';
import { versionTable } from '../lib/postgres/version-table.js';
import { createMigratedDatabase } from '../test/support/migrated-database.js';
import { measureBothModes } from './scale/claim-throughput.js';
import { addExpiredLeases, describeTable, fillClaimsTable, formatSeconds } from './scale/fill.js';
import { runRetention, timedStatements, timeStatements } from './scale/maintenance-timing.js';
import { DEFAULT_ROWS, parseScaleOptions, shortCount } from './scale/scale-options.js';
import {
  goal,
  renderScaleMarkdown,
  renderScaleSummary,
  type MaintenanceLevel,
  type ScaleRun,
  type VersionsRun,
} from './scale/scale-report.js';
import { describeVersions, fillVersionsTable, versionTimedStatements } from './scale/versions.js';
import { startBenchPostgres } from './support/bench-postgres.js';
import { cpuDescription, resultStamp } from './support/run-identity.js';

/**
 * `npm run bench:scale`: fills the claims table to `--rows` (default 10M) rows shaped like 35 days
 * of traffic, then measures claim throughput and each maintenance statement the reporter sends,
 * under a custom and a generic plan. Writes bench/results/<date>-scale-<rows>.{md,json}; a run at
 * the default size also writes its tables into bench/README.md.
 */
const BENCH_DIR = fileURLToPath(new URL('../../bench/', import.meta.url));
const RESULTS_DIR = join(BENCH_DIR, 'results');
const README = join(BENCH_DIR, 'README.md');
const MARKERS = { start: '<!-- scale:start -->', end: '<!-- scale:end -->' };

const options = parseScaleOptions(process.argv.slice(2));
const began = performance.now();
const log = (message: string) =>
  console.log(`[scale ${((performance.now() - began) / 1000).toFixed(1).padStart(6)} s] ${message}`);
const startedAt = new Date().toISOString();
const stamp = resultStamp(new Date(startedAt));
const name =
  `${stamp}-scale-${shortCount(options.rows)}` +
  (options.expiredGiven ? `-expired-${options.expired.map(shortCount).join('-')}` : '');
await mkdir(RESULTS_DIR, { recursive: true });

const postgres = await startBenchPostgres();
let database: { url: string; name: string } | undefined;
let client: pg.Client | undefined;
try {
  database = await createMigratedDatabase(postgres.adminUrl, 'scale');
  client = new pg.Client({ connectionString: database.url });
  await client.connect();
  const setting = async (name: string) =>
    (await client!.query(`SELECT current_setting($1) AS value`, [name])).rows[0].value as string;
  const environment = {
    node: process.version,
    cpu: cpuDescription(),
    'load average at start': loadavg()[0].toFixed(2),
    database: postgres.description,
    shared_buffers: await setting('shared_buffers'),
    work_mem: await setting('work_mem'),
    autovacuum: await setting('autovacuum'),
  };
  const table = claimTable(undefined);
  const statements = claimStatements(table);
  const maintenance = maintenanceStatements(table, { retentionBatchSize: options.retentionBatchSize });
  const versions = versionTable(table);
  const versionMaintenance = versionMaintenanceStatements(versions, {
    retentionBatchSize: options.retentionBatchSize,
  });
  const ordered = {
    statement: orderedClaimStatements(table, versions).applyEqual,
    entities: options.entities,
  };

  log(`claims on the empty table: ${options.clients} clients, ${options.durationS} s per mode`);
  const empty = await measureBothModes(database.url, statements, options.clients, options.durationS, ordered);
  for (const result of empty) log(`empty ${result.mode}: ${result.claimsPerSecond} claims/s`);
  // The empty table's claims are not part of the traffic the fill shapes.
  await client.query(`TRUNCATE ${table.sql}, ${versions.sql}`);

  log(`filling ${options.rows} rows over ${options.days} days, ${options.expired[0]} expired leases`);
  const fill = await fillClaimsTable(client, table, options, log);
  log(`VACUUM (ANALYZE) took ${formatSeconds(fill.vacuumSeconds)}`);
  const filledTable = await describeTable(client, table, options);
  log(`table: ${JSON.stringify(filledTable)}`);
  log(`filling the versions table with ${options.entities} entities`);
  const versionsFill = await fillVersionsTable(client, versions, options, log);
  log(`versions: ${JSON.stringify(versionsFill)}`);

  log(`claims on ${shortCount(options.rows)} rows, ${shortCount(options.entities)} entities`);
  const filled = await measureBothModes(
    database.url,
    statements,
    options.clients,
    options.durationS,
    ordered,
  );
  for (const result of filled)
    log(`${shortCount(options.rows)} ${result.mode}: ${result.claimsPerSecond} claims/s`);

  const levels: MaintenanceLevel[] = [];
  let expiredSoFar = options.expired[0];
  for (const expiredLeases of options.expired) {
    if (expiredLeases > expiredSoFar) {
      log(`adding ${expiredLeases - expiredSoFar} expired leases, VACUUM (ANALYZE)`);
      await addExpiredLeases(client, table, expiredLeases - expiredSoFar, options);
      expiredSoFar = expiredLeases;
    }
    const state = await describeTable(client, table, options);
    log(`maintenance statements, ${state.composition['expired leases'] ?? 0} expired leases`);
    const timings = await timeStatements(
      client,
      timedStatements(table, maintenance, options),
      options.runs,
      log,
    );
    const expired = state.composition['expired leases'] ?? 0;
    levels.push({ label: `${expired} expired leases`, expiredLeases: expired, table: state, timings });
    const { met, worst } = goal(levels.at(-1)!);
    log(
      `goal ${met ? 'met' : 'missed'}: slowest ${worst.name} (${worst.plan}) ${worst.executionMs.median} ms`,
    );
  }

  const retention = [];
  if (options.retentionBatches > 0) {
    const { retentionDays, retentionBatchSize } = options;
    log(`retention: up to ${options.retentionBatches} committed batches of each statement`);
    retention.push(
      await runRetention(
        client,
        'retention batch',
        maintenance.retentionBatch,
        [retentionDays],
        retentionBatchSize,
        options.retentionBatches,
      ),
      await runRetention(
        client,
        'abandoned retention batch',
        maintenance.abandonedRetentionBatch,
        [retentionDays],
        retentionBatchSize,
        options.retentionBatches,
      ),
    );
    for (const run of retention) log(`${run.statement}: ${JSON.stringify(run)}`);
    // Once the abandoned backlog is gone, each report's batch finds nothing to delete: what it
    // costs then is what every report pays.
    const state = await describeTable(client, table, options);
    if (state.abandonedBacklog === 0) {
      log('abandoned retention once caught up');
      const abandoned = timedStatements(table, maintenance, options).filter((statement) =>
        statement.name.startsWith('abandoned'),
      );
      const expired = state.composition['expired leases'] ?? 0;
      levels.push({
        label: `${expired} expired leases, abandoned retention caught up (nothing older than retentionDays left)`,
        expiredLeases: expired,
        table: state,
        timings: await timeStatements(client, abandoned, options.runs, log),
      });
    }
  }

  log('versions retention, with the backlog the fill left');
  const versionTimings = await timeStatements(
    client,
    versionTimedStatements(versions, versionMaintenance, options),
    options.runs,
    log,
  );
  const versionRetention = await runRetention(
    client,
    'versions retention batch',
    versionMaintenance.retentionBatch,
    [options.retentionDays],
    options.retentionBatchSize,
    Math.max(1, options.retentionBatches),
  );
  log(`versions retention: ${JSON.stringify(versionRetention)}`);
  // What every report pays once retention has caught up: nothing older than retentionDays left.
  await client.query(
    `DELETE FROM ${versions.sql} WHERE applied_at < now() - $1::double precision * interval '1 day'`,
    [options.retentionDays],
  );
  await client.query(`VACUUM (ANALYZE) ${versions.sql}`);
  const caughtUpTable = await describeVersions(client, versions, options);
  log('versions retention, caught up');
  const caughtUpTimings = await timeStatements(
    client,
    versionTimedStatements(versions, versionMaintenance, options),
    options.runs,
    log,
  );
  const versionsRun: VersionsRun = {
    fill: versionsFill,
    timings: versionTimings,
    retention: versionRetention,
    caughtUp: { table: caughtUpTable, timings: caughtUpTimings },
  };
  for (const [label, timings] of [
    ['with the backlog', versionTimings],
    ['caught up', caughtUpTimings],
  ] as const) {
    const { met, worst } = goal({ timings });
    log(
      `versions goal ${label} ${met ? 'met' : 'missed'}: ${worst.name} (${worst.plan}) ${worst.executionMs.median} ms`,
    );
  }

  const run: ScaleRun = {
    options,
    environment,
    startedAt,
    finishedAt: new Date().toISOString(),
    fill,
    filledTable,
    claims: { empty, filled },
    levels,
    retention,
    versions: versionsRun,
  };
  await writeFile(join(RESULTS_DIR, `${name}.json`), `${JSON.stringify(run, null, 2)}\n`);
  await writeFile(join(RESULTS_DIR, `${name}.md`), renderScaleMarkdown(run));
  if (options.rows === DEFAULT_ROWS) await writeIntoReadme(renderScaleSummary(run, `results/${name}.md`));
  log(
    `wrote bench/results/${name}.{md,json}${options.rows === DEFAULT_ROWS ? ' and the README tables' : ''}`,
  );
} finally {
  await client?.end();
  if (database && process.env.DATABASE_URL && !options.keep) {
    // A filled database on someone's own server is gigabytes: dropped unless --keep.
    const admin = new pg.Client({ connectionString: postgres.adminUrl });
    await admin.connect();
    await admin.query(`DROP DATABASE IF EXISTS ${database.name}`).finally(() => admin.end());
  } else if (database && process.env.DATABASE_URL) {
    log(`kept database ${database.name}`);
  }
  await postgres.stop();
}

/** Replaces the tables between the scale markers in bench/README.md. */
async function writeIntoReadme(summary: string): Promise<void> {
  const readme = await readFile(README, 'utf8').catch(() => '');
  const start = readme.indexOf(MARKERS.start);
  const end = readme.indexOf(MARKERS.end);
  if (start < 0 || end < start) return;
  const updated = `${readme.slice(0, start + MARKERS.start.length)}\n\n${summary}\n\n${readme.slice(end)}`;
  const config = (await prettier.resolveConfig(README)) ?? {};
  await writeFile(README, await prettier.format(updated, { ...config, filepath: README }));
}
