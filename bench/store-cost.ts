import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { claimTable } from '../lib/postgres/claim-table.js';
import { claimStatements } from '../lib/postgres/claim.sql.js';
import { createMigratedDatabase } from '../test/support/migrated-database.js';
import { spread } from './load/percentiles.js';
import { BENCH_SCHEMA } from './server/hand-written.sql.js';
import { startBenchPostgres } from './support/bench-postgres.js';
import { DatabaseCpu } from './support/database-cpu.js';
import { cpuDescription, resultStamp } from './support/run-identity.js';

/**
 * `npm run bench:store-cost`: what storing a request-mode response costs PostgreSQL on its own,
 * without Node in the way. pgbench (a C client, so the server's work is most of what is measured)
 * sends each transaction pipelined, in one round trip, so that the variants differ only in what the
 * server executes:
 * - `claim`: BEGIN, the library's checked transaction claim, the order insert, COMMIT (lib-tx's work);
 * - `claim+store`: the same plus the library's `store_response` UPDATE (lib-request's work until the
 *   claim at commit, and still a request's that takes back a failed claim);
 * - `claim-at-commit`: lib-request's work: the library's claim at commit (the key's advisory lock and
 *   a read), the order insert, and the claim row inserted with its response, as the COMMIT's query
 *   sends it.
 * Interleaved, the order reversed every repetition. Writes bench/results/<date>-store-cost.{md,json}.
 */
const RESULTS_DIR = fileURLToPath(new URL('../../bench/results/', import.meta.url));

const { values } = parseArgs({
  options: {
    reps: { type: 'string', default: '5' },
    duration: { type: 'string', default: '5' },
    clients: { type: 'string', default: '8' },
  },
});
/** A whole number of at least 1 from the command line, or a clear stop. */
function count(name: string, text: string): number {
  const value = Number(text);
  if (!Number.isInteger(value) || value < 1)
    throw new Error(`--${name} must be a whole number >= 1, got ${text}`);
  return value;
}
const reps = count('reps', values.reps);
const durationS = count('duration', values.duration);
const clients = count('clients', values.clients);

/** The response lib-request's bench route stores (`{ received: true }`, answered 200). */
const RESPONSE = '{"status": 200, "headers": {}, "body": {"received": true}}';
/** A key per transaction; pgbench's own variables, so no two clients share one. */
const KEY = `(:client_id || '_' || :k)`;
const ORDER = `INSERT INTO orders (event_id, variant, type, amount, currency, customer)
VALUES (${KEY}, 'store-cost', 'payment_intent.succeeded', 500, 'eur', 'cus_1')`;

/** `text` with its $n replaced by `values[n - 1]` (SQL literals and pgbench expressions). */
function inline(text: string, given: string[]): string {
  // pgbench reads a command up to its semicolon; the statements hold none inside.
  return text.replace(/\$(\d+)/g, (_, n: string) => given[Number(n) - 1]!);
}

/** A script of one transaction, pipelined in one round trip; pgbench runs it over and over. */
function script(commands: string[]): string {
  return [
    '\\set k random(1, 9000000000000000000)',
    '\\startpipeline',
    'BEGIN;',
    ...commands.map((command) => `${command};`),
    'COMMIT;',
    '\\endpipeline',
    '',
  ].join('\n');
}

const statements = claimStatements(claimTable(undefined), true);
const claim = inline(statements.transactionClaim.text, ["'store-cost'", KEY, "'bench'", "'5000'", "'fp'"]);
const store = inline(statements.storeResponse!.text, ["'store-cost'", KEY, `'${RESPONSE}'`]);
const SCRIPTS = {
  claim: script([claim, ORDER]),
  'claim+store': script([claim, ORDER, store]),
  'claim-at-commit': script([
    inline(statements.claimAtCommit!.text, ["'store-cost'", KEY, "'bench'", "'5000'", "'fp'"]),
    ORDER,
    inline(statements.claimAtCommitInsert!.text, ["'store-cost'", KEY, "'bench'", "'fp'", `'${RESPONSE}'`]),
  ]),
};
type Variant = keyof typeof SCRIPTS;
const VARIANTS = Object.keys(SCRIPTS) as Variant[];

/** The share of `runs`' updates that were HOT, 0 when there were none. */
function hotShare(runs: { updates: number; hotUpdates: number }[]): number {
  const all = runs.reduce((sum, run) => sum + run.updates, 0);
  return all === 0 ? 0 : Math.round((runs.reduce((sum, run) => sum + run.hotUpdates, 0) / all) * 1000) / 1000;
}

/** Seconds each variant runs before the measured repetitions. */
const WARM_UP_S = 2;

/** Runs pgbench once, for `seconds`; its transactions and tps. */
function pgbench(
  file: string,
  url: string,
  seconds = durationS,
): Promise<{ transactions: number; tps: number }> {
  const args = ['-n', '-M', 'prepared', '-c', String(clients), '-j', '2', '-T', String(seconds), '-f', file];
  return new Promise((resolve, reject) => {
    const child = spawn('pgbench', [...args, url], { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk) => (output += chunk));
    child.stderr.on('data', (chunk) => (output += chunk));
    child.on('error', (error) =>
      reject(new Error(`pgbench did not start (${error.message}): apt-get install postgresql-client`)),
    );
    child.on('exit', (code) => {
      const transactions = Number(/actually processed: (\d+)/.exec(output)?.[1]);
      const tps = Number(/tps = ([\d.]+)/.exec(output)?.[1]);
      if (code !== 0 || !transactions) reject(new Error(`pgbench failed (${code}):\n${output}`));
      else resolve({ transactions, tps });
    });
  });
}

/** The claims table's updates so far, and how many of them were HOT (no index entry written). */
async function updates(client: pg.Client): Promise<{ all: number; hot: number }> {
  const { rows } = await client.query<{ all: string; hot: string }>(
    `SELECT n_tup_upd AS all, n_tup_hot_upd AS hot FROM pg_stat_user_tables WHERE relname = 'processed_events'`,
  );
  return { all: Number(rows[0]?.all ?? 0), hot: Number(rows[0]?.hot ?? 0) };
}

const began = new Date();
const loadAtStart = loadavg()[0].toFixed(2);
const stamp = resultStamp(began);

const postgres = await startBenchPostgres();
let dir: string | undefined;
let database: { url: string; name: string } | undefined;
const client = new pg.Client({ connectionString: postgres.adminUrl });
let benchClient: pg.Client | undefined;
try {
  dir = await mkdtemp(join(tmpdir(), 'store-cost-'));
  database = await createMigratedDatabase(postgres.adminUrl, 'store_cost', BENCH_SCHEMA);
  await client.connect();
  benchClient = new pg.Client({ connectionString: database.url });
  await benchClient.connect();
  const bench = benchClient;
  const meter = await DatabaseCpu.open(client);
  for (const variant of VARIANTS) await writeFile(join(dir, `${variant}.sql`), SCRIPTS[variant]);
  const runs: Record<
    Variant,
    { tps: number; cpuUsPerTransaction: number | null; updates: number; hotUpdates: number }[]
  > = {
    claim: [],
    'claim+store': [],
    'claim-at-commit': [],
  };
  // Warm-up, not counted: a fresh table's first thousands of rows (relation and index growth, the
  // plans) cost several times a steady transaction, and would fall on the first variant only.
  for (const variant of VARIANTS) await pgbench(join(dir, `${variant}.sql`), database.url, WARM_UP_S);
  for (let rep = 0; rep < reps; rep++) {
    const order = rep % 2 === 0 ? VARIANTS : [...VARIANTS].reverse();
    for (const variant of order) {
      // Each run starts from a vacuumed table, so that no autovacuum the last run set off lands in this
      // one's CPU window, which a variant's own garbage would otherwise charge to the next.
      await bench.query('VACUUM processed_events, orders');
      const updatesBefore = await updates(bench);
      const before = await meter?.read();
      const { transactions, tps } = await pgbench(join(dir, `${variant}.sql`), database.url);
      const after = await meter?.read();
      const updatesAfter = await updates(bench);
      const cpu = before === undefined || after === undefined ? null : (after - before) / transactions;
      runs[variant].push({
        tps,
        cpuUsPerTransaction: cpu === null ? null : Math.round(cpu * 10) / 10,
        updates: updatesAfter.all - updatesBefore.all,
        hotUpdates: updatesAfter.hot - updatesBefore.hot,
      });
      console.log(
        `[store-cost] rep ${rep + 1}/${reps} ${variant}: ${tps.toFixed(0)} tps, ` +
          `${cpu === null ? 'n/a' : cpu.toFixed(1)} µs of PostgreSQL CPU per transaction`,
      );
    }
  }
  const summary = Object.fromEntries(
    VARIANTS.map((variant) => {
      const cpu = runs[variant].map((run) => run.cpuUsPerTransaction).filter((us) => us !== null);
      return [
        variant,
        { tps: spread(runs[variant].map((run) => run.tps)), cpu: cpu.length ? spread(cpu) : null },
      ];
    }),
  ) as Record<Variant, { tps: ReturnType<typeof spread>; cpu: ReturnType<typeof spread> | null }>;
  // Within each repetition, so that drift falls on both sides.
  const ratio = (variant: Variant) => spread(runs[variant].map((run, rep) => run.tps / runs.claim[rep]!.tps));
  const result = {
    startedAt: began.toISOString(),
    environment: {
      cpu: cpuDescription(),
      loadAverageAtStart: loadAtStart,
      postgres: postgres.description,
    },
    options: { reps, durationS, clients },
    scripts: SCRIPTS,
    runs,
    summary,
    ratios: { 'claim+store/claim': ratio('claim+store'), 'claim-at-commit/claim': ratio('claim-at-commit') },
    /** Of claim+store's UPDATEs, the share that was HOT (the row's new version on its own page, no index entry). */
    hotShare: hotShare(runs['claim+store']),
  };
  const row = (variant: Variant) => {
    const { tps, cpu } = summary[variant];
    const cpuText = cpu ? `${cpu.median} (${cpu.min}–${cpu.max})` : 'n/a';
    const vs = variant === 'claim' ? '1' : `${result.ratios[`${variant}/claim`].median}`;
    return `| ${variant} | ${Math.round(tps.median)} | ${vs} | ${cpuText} |`;
  };
  const markdown = [
    `# What storing the response costs PostgreSQL (${began.toISOString()})`,
    '',
    `${postgres.description}; ${result.environment.cpu}; load average ${result.environment.loadAverageAtStart} at the start.`,
    `pgbench, ${clients} clients, ${WARM_UP_S} s of each variant to warm up, then ${reps} interleaved repetitions of ${durationS} s, each transaction pipelined in one round trip.`,
    '',
    '| transaction | tps (median) | tps vs claim (median within repetitions) | PostgreSQL CPU µs per transaction, median (min–max) |',
    '|---|---:|---:|---:|',
    ...VARIANTS.map(row),
    '',
    `Of claim+store's \`store_response\` UPDATEs, ${(result.hotShare * 100).toFixed(1)}% were HOT (\`pg_stat_user_tables\`).`,
    '',
    '## The scripts',
    '',
    ...VARIANTS.flatMap((variant) => [`### ${variant}`, '', '```sql', SCRIPTS[variant].trim(), '```', '']),
  ].join('\n');
  await mkdir(RESULTS_DIR, { recursive: true });
  const base = join(RESULTS_DIR, `${stamp}-store-cost`);
  await writeFile(`${base}.json`, `${JSON.stringify(result, null, 2)}\n`);
  await writeFile(`${base}.md`, markdown);
  console.log(`[store-cost] wrote ${base}.{md,json}`);
  console.log(JSON.stringify(result.ratios));
} finally {
  await benchClient?.end().catch(() => undefined);
  if (database && process.env.DATABASE_URL) {
    // On someone's own server: the run's million rows are dropped, as bench:scale drops its own.
    await client.query(`DROP DATABASE IF EXISTS ${database.name}`).catch(() => undefined);
  }
  await client.end().catch(() => undefined);
  await postgres.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
}
