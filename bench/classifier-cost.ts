import { mkdir, writeFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import type { Logger } from '@nestjs/common';
import type { DataSource, QueryRunner } from 'typeorm';
import { ClaimDelivery } from '../lib/core/claim-delivery.js';
import type { ClaimSpec } from '../lib/core/claim-strategy.js';
import { runInIdempotencyContext } from '../lib/core/idempotency-context.js';
import { ClaimTransaction } from '../lib/postgres/claim-transaction.js';
import type { ClaimTransactionOptions } from '../lib/postgres/transaction-session.js';
import { OutsideWriteSubscriber } from '../lib/postgres/outside-write.subscriber.js';
import { loadStatementClassifier } from '../lib/postgres/statement.classifier.js';
import { spread } from './load/percentiles.js';
import { cpuDescription, resultStamp } from './support/run-identity.js';

/**
 * `npm run bench:classifier`: what the outside-write check costs per statement, without a database.
 * PostgreSQL's parser (libpg-query, WebAssembly) classifies a statement that a transaction-mode
 * handler sends through another runner than the claim's; its class is cached per SQL text. Per
 * statement, in microseconds:
 * - `cold`: the parse and the classification, every call (a classifier that keeps nothing);
 * - `cached`: the same text classified again (what a handler's repeated statements pay);
 * - `pattern`: f77e10f's regular expression on the same text, for reference (the check it replaces);
 * - `outside`: the subscriber's whole `beforeQuery` for the statement on another runner, cached;
 * - `own runner`: `beforeQuery` for the statement on the claim's own runner, the happy path: it
 *   returns before any classifying, as it did at f77e10f.
 * Interleaved: every round measures every statement in every mode, the order of the modes reversed
 * every round. Also the parser's load, once per process, at module init. Writes
 * bench/results/<date>-classifier.{md,json}.
 */
const RESULTS_DIR = fileURLToPath(new URL('../../bench/results/', import.meta.url));

const { values } = parseArgs({
  options: {
    rounds: { type: 'string', default: '7' },
    quick: { type: 'boolean', default: false },
  },
});
const rounds = values.quick ? 3 : Number(values.rounds);
if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds must be a whole number >= 1`);
/** Calls per measurement: a parse takes tens of microseconds, a cache hit well under one. */
const CALLS = values.quick ? { cold: 500, warm: 20_000 } : { cold: 2_000, warm: 100_000 };

/** Statements as TypeORM and handlers send them (TypeORM sends parameters apart). */
const STATEMENTS: Record<string, string> = {
  'insert (repository)': 'INSERT INTO "orders"("event_id", "amount") VALUES ($1, $2) RETURNING "id"',
  'insert (.comment())':
    '/* trace=abc */ INSERT INTO "orders"("event_id", "amount") VALUES ($1, $2) RETURNING "id"',
  'select (findOneBy)':
    'SELECT "OrderRow"."id" AS "OrderRow_id", "OrderRow"."event_id" AS "OrderRow_event_id", ' +
    '"OrderRow"."amount" AS "OrderRow_amount" FROM "orders" "OrderRow" WHERE (("OrderRow"."event_id" = $1)) LIMIT 1',
  'with read (keywords)':
    `WITH "update" AS (/* not an update */ SELECT 'insert into orders; delete' AS note) ` +
    `SELECT count(*)::int AS notes FROM "update" -- merge`,
  'select, 3 joins':
    'SELECT "o"."id" AS "o_id", "o"."event_id" AS "o_event_id", "c"."id" AS "c_id", "c"."email" AS "c_email", ' +
    '"l"."id" AS "l_id", "l"."sku" AS "l_sku", "l"."quantity" AS "l_quantity", "p"."id" AS "p_id", ' +
    '"p"."status" AS "p_status" FROM "orders" "o" LEFT JOIN "customers" "c" ON "c"."id" = "o"."customer_id" ' +
    'LEFT JOIN "order_lines" "l" ON "l"."order_id" = "o"."id" LEFT JOIN "payments" "p" ON "p"."order_id" = "o"."id" ' +
    'WHERE "o"."event_id" IN ($1, $2, $3) AND "p"."status" <> $4 ORDER BY "o"."id" DESC, "l"."id" ASC LIMIT 50',
  'function call': 'SELECT outside_orders_seen($1)',
};

/** f77e10f's check, the pattern this replaced (for reference only). */
const PATTERN =
  /^\s*(?:(?:INSERT|UPDATE|DELETE|MERGE|TRUNCATE)\b|WITH\b[\s\S]*\b(?:INSERT|UPDATE|DELETE|MERGE)\b)/i;

const MODES = ['cold', 'cached', 'pattern', 'outside', 'own runner'] as const;
type Mode = (typeof MODES)[number];

/** Microseconds per call of `fn` over `calls` calls. */
function time(calls: number, fn: () => unknown): number {
  let sink = 0;
  const started = process.hrtime.bigint();
  for (let i = 0; i < calls; i++) if (fn()) sink++;
  const elapsed = Number(process.hrtime.bigint() - started) / 1000 / calls;
  return sink < 0 ? Number.NaN : elapsed;
}

const began = new Date();
const loadAtStart = loadavg()[0]!.toFixed(2);
const loadStarted = process.hrtime.bigint();
const cached = await loadStatementClassifier();
const loadMs = Number(process.hrtime.bigint() - loadStarted) / 1e6;
// A classifier that keeps no text: every call parses.
const cold = await loadStatementClassifier({ maxLength: 0 });

// The subscriber as ClaimDatabase installs it, in a delivery whose transaction has its runner.
const ownRunner = {} as QueryRunner;
const otherRunner = {} as QueryRunner;
const dataSource = { createQueryRunner: () => ownRunner, entityMetadatas: [] } as unknown as DataSource;
const quiet = { warn: () => undefined } as unknown as Logger;
const subscriber = new OutsideWriteSubscriber(dataSource, false, quiet, cached);
const transaction = new ClaimTransaction(dataSource, {} as ClaimTransactionOptions);
void transaction.runner; // made once, as the handler's manager makes it
const spec = { scope: 'bench.classifier', source: 'bench', mode: 'transaction' } as ClaimSpec;
const delivery = new ClaimDelivery(spec, 'evt_bench', transaction);

function measure(mode: Mode, sql: string): number {
  switch (mode) {
    case 'cold':
      return time(CALLS.cold, () => cold.classify(sql));
    case 'cached':
      return time(CALLS.warm, () => cached.classify(sql));
    case 'pattern':
      return time(CALLS.warm, () => PATTERN.test(sql));
    case 'outside':
    case 'own runner': {
      const event = { query: sql, queryRunner: mode === 'outside' ? otherRunner : ownRunner };
      return runInIdempotencyContext(delivery, () => time(CALLS.warm, () => subscriber.beforeQuery(event)));
    }
  }
}

const samples: Record<string, Record<Mode, number[]>> = {};
for (const name of Object.keys(STATEMENTS)) {
  samples[name] = Object.fromEntries(MODES.map((mode) => [mode, [] as number[]])) as Record<Mode, number[]>;
  // Warm-up, not counted: V8's tiers and the cache's first entry.
  for (const mode of MODES) measure(mode, STATEMENTS[name]!);
}
for (let round = 0; round < rounds; round++) {
  const order = round % 2 === 0 ? MODES : [...MODES].reverse();
  for (const [name, sql] of Object.entries(STATEMENTS)) {
    for (const mode of order) samples[name]![mode].push(measure(mode, sql));
  }
  console.log(`[classifier] round ${round + 1}/${rounds}`);
}

const round3 = (us: number) => Math.round(us * 1000) / 1000;
type Spread = ReturnType<typeof spread>;
const summary: Record<string, { effect: string } & Record<Mode, Spread>> = Object.fromEntries(
  Object.entries(samples).map(([name, byMode]) => [
    name,
    {
      effect: cached.classify(STATEMENTS[name]!).effect,
      ...(Object.fromEntries(MODES.map((mode) => [mode, spread(byMode[mode].map(round3))])) as Record<
        Mode,
        Spread
      >),
    },
  ]),
);
const result = {
  startedAt: began.toISOString(),
  environment: { cpu: cpuDescription(), loadAverageAtStart: loadAtStart, node: process.version },
  options: { rounds, calls: CALLS },
  parserLoadMs: Math.round(loadMs * 10) / 10,
  statements: STATEMENTS,
  summary,
};
const cell = (s: Spread) => `${s.median} (${s.min}–${s.max})`;
const markdown = [
  `# What the outside-write check costs per statement (${began.toISOString()})`,
  '',
  `${result.environment.cpu}; Node ${process.version}; load average ${loadAtStart} at the start.`,
  `libpg-query loaded in ${result.parserLoadMs} ms (once per process, at module init).`,
  `${rounds} interleaved rounds (the order of the modes reversed every round); per measurement ${CALLS.cold} calls cold, ${CALLS.warm} otherwise.`,
  'µs per statement, median (min–max) of the rounds:',
  '',
  '| statement | class | cold (parse) | cached | pattern (f77e10f) | beforeQuery, another runner | beforeQuery, the claim’s runner |',
  '|---|---|---:|---:|---:|---:|---:|',
  ...Object.entries(summary).map(
    ([name, s]) =>
      `| ${name} | ${s.effect} | ${cell(s.cold)} | ${cell(s.cached)} | ${cell(s.pattern)} | ${cell(s.outside)} | ${cell(s['own runner'])} |`,
  ),
  '',
  '## The statements',
  '',
  ...Object.entries(STATEMENTS).flatMap(([name, sql]) => [`- ${name}: \`${sql}\``]),
  '',
].join('\n');
const stamp = resultStamp(began);
await mkdir(RESULTS_DIR, { recursive: true });
const base = join(RESULTS_DIR, `${stamp}-classifier${values.quick ? '-quick' : ''}`);
await writeFile(`${base}.json`, `${JSON.stringify(result, null, 2)}\n`);
await writeFile(`${base}.md`, markdown);
console.log(markdown);
console.log(`[classifier] wrote ${base}.{md,json}`);
