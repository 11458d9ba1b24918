import { readFile, rm, writeFile } from 'node:fs/promises';
import { gzipSync } from 'node:zlib';
import { join } from 'node:path';
import pg from 'pg';
import {
  baselinePairResult,
  measureBaselineRep,
  startBaselineServer,
  type LoadFn,
} from './baseline-comparison.js';
import type { AdapterName, BenchOptions } from './bench-options.js';
import { keepAliveAgent, postJson } from './load/http-post.js';
import { measureNetworkPaths } from './network-paths.js';
import { runLoad, type LoadResult } from './load/load-run.js';
import { round, spread } from './load/percentiles.js';
import { runStorm } from './load/storm.js';
import { eventIds, stripeEventBody } from './load/stripe-event.js';
import { attributeCpu, type CpuProfile } from './report/cpu-attribution.js';
import { renderFlameGraph } from './report/flame-graph.js';
import type {
  AdapterResult,
  AsyncWork,
  BaselinePairResult,
  BaselineRep,
  CellResult,
  RatioRep,
  RatioResult,
  Trace,
} from './report/bench-result.js';
import type { BaselineCheckout } from './support/baseline-checkout.js';
import { createBenchDatabase, type BenchPostgres } from './support/bench-postgres.js';
import { DatabaseCpu } from './support/database-cpu.js';
import { ServerProcess } from './support/server-process.js';
import { StatementStats } from './support/statement-stats.js';
import {
  GUARD_PAIRS,
  HEADLINE_PAIRS,
  REFERENCE_PAIRS,
  REQUEST_PAIRS,
  VARIANTS,
  WORKLOADS,
  type Pair,
  type Variant,
  type Workload,
} from './variants.js';

/** Where a run writes its files, and the tag that names them. */
export interface RunTarget {
  /** Where CPU profiles and flame graphs go: bench/profiles/, which git ignores (megabytes a run). */
  profilesDir: string;
  stamp: string;
  /** Unique per run: keeps event ids of different runs on one database apart. */
  runTag: string;
}

const began = performance.now();
const log = (message: string) =>
  console.log(`[bench ${((performance.now() - began) / 1000).toFixed(1).padStart(5)} s] ${message}`);

/**
 * Every measurement of issue 5 on one adapter, against a fresh database and a fresh server. With
 * a `baseline` checkout, its own bench server also runs during the headline repetitions, which
 * then measure both servers interleaved.
 */
export async function runAdapter(
  adapter: AdapterName,
  options: BenchOptions,
  postgres: BenchPostgres,
  target: RunTarget,
  baseline?: BaselineCheckout,
): Promise<AdapterResult> {
  const startedAt = new Date().toISOString();
  const database = await createBenchDatabase(postgres.adminUrl);
  const server = await ServerProcess.start({
    adapter,
    databaseUrl: database.url,
    poolSize: options.poolSize,
    duplicateWaitMs: options.duplicateWaitMs,
  });
  const statements = postgres.statementStats
    ? await StatementStats.open(postgres.adminUrl, database.name)
    : undefined;
  const checker = new pg.Client({ connectionString: database.url });
  await checker.connect();
  const databaseCpu = await DatabaseCpu.open(checker);
  let cellNumber = 0;
  const nextCell = () => eventIds(target.runTag, (cellNumber++).toString(36).padStart(3, '0'));
  const loadOn =
    (url: string) =>
    (variant: Variant, workload: Workload, durationS: number, ids = nextCell()) =>
      runLoad({ url, variant, workload, durationS, connections: options.connections, nextId: ids.next });
  const load = loadOn(server.url);

  try {
    log(`${adapter}: server at ${server.url}, warming up`);
    for (const variant of VARIANTS) await load(variant, 'unique', options.warmS);

    const traces = (await traceAll(server, nextCell().next, VARIANTS)) as AdapterResult['traces'];
    const asyncWork = (await countAsyncWork(server, nextCell().next, VARIANTS)) as AdapterResult['asyncWork'];

    const cells: CellResult[] = [];
    for (const workload of options.pathsOnly ? [] : WORKLOADS) {
      for (const variant of VARIANTS) {
        if (options.mode === 'full') await load(variant, workload, options.warmS);
        const ids = nextCell();
        await server.reset();
        await statements?.reset();
        const databaseCpuSince = databaseCpu && { meter: databaseCpu, before: await databaseCpu.read() };
        const result = await load(variant, workload, options.cellS, ids);
        cells.push(
          await measureCell(
            variant,
            workload,
            result,
            ids.prefix,
            server,
            statements,
            checker,
            databaseCpuSince,
          ),
        );
        log(`${adapter} ${workload.padEnd(6)} ${variant.padEnd(12)} ${describe(cells.at(-1)!)}`);
      }
    }

    let ratios: Record<string, RatioResult> = {};
    let baselineResult: Pick<AdapterResult, 'baseline' | 'baselineServerLog'> = {};
    if (options.pathsOnly) {
      // Only the traces and the network paths below.
    } else if (baseline) {
      // The same database when the schema is the same: both servers then write to the very same
      // tables and indexes, so the direct ratio differs by the library's code alone.
      const baselineUrl = baseline.sameSchema
        ? database.url
        : (await baseline.createDatabase(postgres.adminUrl)).url;
      log(`${adapter}: baseline server (${baseline.commit.slice(0, 7)}), warming up`);
      const side = await startBaselineServer(baseline, adapter, options, baselineUrl, loadOn);
      try {
        const measured = await interleavedRatios(options, load, adapter, {
          load: side.load,
          pairs: baseline.pairs.measured,
        });
        ratios = measured.ratios;
        baselineResult = {
          baseline: measured.baseline,
          baselineServerLog: { lines: side.server.log.count, tail: side.server.log.lines },
        };
      } finally {
        // Stopped before the storm and the profiles, which measure the current server alone.
        await side.server.stop();
      }
    } else {
      ratios = (await interleavedRatios(options, load, adapter)).ratios;
    }
    const paths =
      options.latencyMs.length > 0 || options.unprepared
        ? await measureNetworkPaths({
            options,
            adapter,
            databaseUrl: database.url,
            main: { server, load },
            loadOn,
            trace: (other, variants) => traceAll(other, nextCell().next, variants),
            log,
          })
        : undefined;

    const storm = [];
    for (const variant of options.pathsOnly ? [] : options.storm.variants) {
      const ids = nextCell();
      const result = await runStorm({
        url: server.url,
        databaseUrl: database.url,
        variant,
        ...options.storm,
        nextId: ids.next,
        probe: async () => {
          const { rows } = await checker.query(
            `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`,
            [database.name],
          );
          const { pool } = await server.stats();
          return { lockWaiters: rows[0].n, poolWaiting: pool.waiting, poolTotal: pool.total };
        },
      });
      storm.push(result);
      log(
        `${adapter} storm ${variant}: unrelated p99 ${result.unrelatedCalm.p99} ms calm, ` +
          `${result.unrelatedStorm.p99} ms storm; duplicates ${JSON.stringify(result.duplicates.answers)}`,
      );
    }

    const cpu =
      options.profileS > 0 && !options.pathsOnly
        ? await profile(options, server, load, adapter, target)
        : null;
    return {
      adapter,
      startedAt,
      finishedAt: new Date().toISOString(),
      traces,
      asyncWork,
      happyPath: {
        'lib-tx vs raw-tx': extraRoundTrips(traces['lib-tx'].first, traces['raw-tx'].first),
        'lib-external vs raw-lease': extraRoundTrips(traces['lib-external'].first, traces['raw-lease'].first),
        // The ordering guard's version check travels in the claim's query: 0 expected.
        'lib-tx-ordered vs lib-tx': extraRoundTrips(traces['lib-tx-ordered'].first, traces['lib-tx'].first),
      },
      cells,
      ratios,
      storm,
      cpu,
      serverLog: { lines: server.log.count, tail: server.log.lines },
      ...baselineResult,
      ...(paths && { paths }),
    };
  } finally {
    await checker.end();
    await statements?.close();
    await server.stop();
  }
}

/** One new event and then a duplicate of it, through each variant, every statement recorded. */
/** Deliveries per variant whose async work is counted: enough to average out a pool's housekeeping. */
const COUNTED_DELIVERIES = 50;

/**
 * The promises and async resources each variant creates per delivery, for new keys and for
 * replays of a key already done: COUNTED_DELIVERIES sequential deliveries on one keep-alive
 * connection, counted by the server (bench/server/async-counter.ts).
 */
async function countAsyncWork(server: ServerProcess, nextId: () => string, variants: readonly Variant[]) {
  const agent = keepAliveAgent(1);
  const work: Partial<Record<Variant, { unique: AsyncWork; duplicate: AsyncWork }>> = {};
  const perDelivery = (counts: Record<string, number>): AsyncWork => {
    const byType = Object.fromEntries(
      Object.entries(counts).map(([type, count]) => [type, round(count / COUNTED_DELIVERIES, 2)]),
    );
    const promises = byType.PROMISE ?? 0;
    const all = Object.values(counts).reduce((sum, count) => sum + count, 0) / COUNTED_DELIVERIES;
    return { deliveries: COUNTED_DELIVERIES, promises, resources: round(all - promises, 2), byType };
  };
  for (const variant of variants) {
    const ids = Array.from({ length: COUNTED_DELIVERIES }, () => nextId());
    // With the event's id as the Idempotency-Key: without it the request-mode routes answer 400,
    // and a refusal's count is not a delivery's. Every answer must be 2xx for the same reason.
    const send = async (id: string) => {
      const { status } = await postJson(
        agent,
        server.url,
        `/${variant}`,
        stripeEventBody(id, 1),
        performance.now(),
        id,
      );
      if (status < 200 || status >= 300) {
        throw new Error(`${variant} answered ${status} while its async work was counted`);
      }
    };
    const unique = await server.countAsync(async () => {
      for (const id of ids) await send(id);
    });
    // The same keys again: replays (or, for the variant without dedupe, new orders again).
    const duplicate = await server.countAsync(async () => {
      for (const id of ids) await send(id);
    });
    work[variant] = { unique: perDelivery(unique), duplicate: perDelivery(duplicate) };
  }
  agent.destroy();
  return work;
}

async function traceAll(server: ServerProcess, nextId: () => string, variants: readonly Variant[]) {
  const agent = keepAliveAgent(1);
  const traces: Partial<Record<Variant, { first: Trace; duplicate: Trace }>> = {};
  for (const variant of variants) {
    const id = nextId();
    const body = stripeEventBody(id, 1);
    const send = async (): Promise<Trace> => {
      const { result, queries } = await server.trace(() =>
        postJson(agent, server.url, `/${variant}`, body, performance.now(), id),
      );
      return { status: result.status, queries };
    };
    traces[variant] = { first: await send(), duplicate: await send() };
  }
  agent.destroy();
  return traces;
}

function extraRoundTrips(lib: Trace, raw: Trace) {
  return { lib: lib.queries.length, raw: raw.queries.length, extra: lib.queries.length - raw.queries.length };
}

async function measureCell(
  variant: Variant,
  workload: Workload,
  load: LoadResult,
  prefix: string,
  server: ServerProcess,
  statements: StatementStats | undefined,
  checker: pg.Client,
  /** The database server's CPU meter and its reading before the load (absent when not local). */
  databaseCpu?: { meter: DatabaseCpu; before: number },
): Promise<CellResult> {
  const stats = await server.settledStats();
  // Read before the statistics and checks below, so that their own queries are not counted.
  const databaseCpuUs = databaseCpu ? (await databaseCpu.meter.read()) - databaseCpu.before : undefined;
  const executed = await statements?.read();
  // Per delivery received: the handlers of requests autocannon dropped at its deadline still ran.
  const events = Math.max(stats.requests, 1);
  const perEvent = (value: number) => round(value / events, 3);
  const { rows } = await checker.query(
    `SELECT count(*)::int AS rows, count(DISTINCT event_id)::int AS distinct FROM orders WHERE event_id LIKE $1`,
    [`${prefix}%`],
  );
  const { rows: orderRows, distinct } = rows[0];
  // Every event answered 2xx must have its order row: a 200 for work that never happened is the hole.
  const { rows: missing } = await checker.query(
    `SELECT count(*)::int AS n FROM unnest($1::text[]) AS answered(id)
     WHERE NOT EXISTS (SELECT 1 FROM orders WHERE event_id = answered.id)`,
    [load.answeredIds],
  );
  const { answeredIds, ...loadSummary } = load;
  return {
    variant,
    workload,
    load: loadSummary,
    server: {
      received: stats.requests,
      answered: stats.answered,
      statuses: stats.statuses,
      cpuUsPerEvent: round((stats.cpuUserUs + stats.cpuSystemUs) / events, 1),
      queries: stats.queries,
      statementsPerEvent: perEvent(stats.queries.statements),
      roundTripsPerEvent: perEvent(stats.queries.queries),
      wireRoundTripsPerEvent: perEvent(stats.queries.readyForQuery),
    },
    database: executed
      ? {
          calls: executed.calls,
          execMs: round(executed.execMs),
          statementsPerEvent: perEvent(executed.calls),
          execUsPerEvent: round((executed.execMs * 1000) / events, 1),
          cpuUsPerEvent: databaseCpuUs === undefined ? null : round(databaseCpuUs / events, 1),
          statements: executed.statements.slice(0, 8),
        }
      : null,
    effect: {
      orderRows,
      distinctOrders: distinct,
      answeredIds: answeredIds.length,
      double: orderRows - distinct,
      missing: missing[0].n,
    },
  };
}

/**
 * Each pair's sides alternate (lib raw, raw lib, ...) for `reps` repetitions, so drift on a shared
 * machine falls on both; the ratio is taken within each repetition. With `baseline` (the
 * baseline server's load, and the pairs of BASELINE_PAIRS it has both routes of), each repetition
 * of one of those pairs runs four sides, both servers'; the other pairs run on the current server.
 */
async function interleavedRatios(
  options: BenchOptions,
  load: LoadFn,
  adapter: string,
  baseline?: { load: LoadFn; pairs: readonly Pair[] },
): Promise<{ ratios: Record<string, RatioResult>; baseline?: Record<string, BaselinePairResult> }> {
  // The reference pairs double the time; a quick run (< 60 s) keeps to the headline, the request
  // mode's and the ordering guard's.
  const pairs =
    options.mode === 'full'
      ? [...HEADLINE_PAIRS, ...REQUEST_PAIRS, ...REFERENCE_PAIRS, ...GUARD_PAIRS]
      : [...HEADLINE_PAIRS, ...REQUEST_PAIRS, ...GUARD_PAIRS];
  const reps: Record<string, RatioRep[]> = Object.fromEntries(pairs.map((pair) => [pair.name, []]));
  const baselinePairs = baseline?.pairs ?? [];
  const onBaseline = (pair: Pair) => baselinePairs.some((measured) => measured.name === pair.name);
  const baselineReps: Record<string, BaselineRep[]> = Object.fromEntries(
    baselinePairs.map((pair) => [pair.name, []]),
  );
  for (let rep = 0; rep < options.reps; rep++) {
    for (const pair of pairs) {
      if (baseline && onBaseline(pair)) {
        const both = await measureBaselineRep(rep, pair, load, baseline.load, options.ratioS);
        baselineReps[pair.name].push(both);
        const current = (variant: Variant) =>
          both.sides.find((side) => side.side === 'current' && side.variant === variant)!;
        reps[pair.name].push({
          first: both.sides.find((side) => side.side === 'current')!.variant,
          libEventsPerSecond: current(pair.lib).eventsPerSecond,
          rawEventsPerSecond: current(pair.raw).eventsPerSecond,
          ratio: both.current,
          libP50Ms: current(pair.lib).p50Ms,
          rawP50Ms: current(pair.raw).p50Ms,
        });
        continue;
      }
      const order: Variant[] = rep % 2 === 0 ? [pair.raw, pair.lib] : [pair.lib, pair.raw];
      const runs: Partial<Record<Variant, LoadResult>> = {};
      for (const variant of order) runs[variant] = await load(variant, 'unique', options.ratioS);
      const lib = runs[pair.lib]!;
      const raw = runs[pair.raw]!;
      reps[pair.name].push({
        first: order[0],
        libEventsPerSecond: lib.eventsPerSecond,
        rawEventsPerSecond: raw.eventsPerSecond,
        ratio: lib.eventsPerSecond / raw.eventsPerSecond,
        libP50Ms: lib.latencyMs.p50,
        rawP50Ms: raw.latencyMs.p50,
      });
    }
    log(
      `${adapter} ratios rep ${rep + 1}/${options.reps}: ` +
        pairs.map((pair) => `${pair.name} ${reps[pair.name].at(-1)!.ratio.toFixed(3)}`).join(', ') +
        (baseline
          ? '; baseline ' +
            baselinePairs
              .map((pair) => {
                const both = baselineReps[pair.name].at(-1)!;
                return `${pair.name} ${both.baseline.toFixed(3)}, ${pair.lib} current/baseline ${both.direct.toFixed(3)}`;
              })
              .join(', ')
          : ''),
    );
  }
  const ratios = Object.fromEntries(
    pairs.map((pair) => [
      pair.name,
      {
        ...spread(reps[pair.name].map((rep) => rep.ratio)),
        reps: reps[pair.name].map((rep) => ({ ...rep, ratio: round(rep.ratio, 3) })),
      },
    ]),
  );
  if (!baseline) return { ratios };
  return {
    ratios,
    baseline: Object.fromEntries(
      baselinePairs.map((pair) => [pair.name, baselinePairResult(baselineReps[pair.name])]),
    ),
  };
}

/** The variants drawn as flame graphs: the library, and what any interceptor alone costs. */
const FLAME_GRAPHS: readonly Variant[] = ['lib-tx', 'raw-tx-intercepted'];

/**
 * A CPU profile of every variant under the same load, after a warm-up, attributed by code
 * location; kept gzipped in bench/profiles (a profile is several MB of JSON, so git ignores the
 * folder: the attribution in the run's .md is what a page cites), with flame graphs of
 * FLAME_GRAPHS beside them.
 */
async function profile(
  options: BenchOptions,
  server: ServerProcess,
  load: LoadFn,
  adapter: string,
  target: RunTarget,
) {
  const cpu: NonNullable<AdapterResult['cpu']> = { profiles: {}, flameGraphs: {} };
  for (const variant of VARIANTS) {
    await load(variant, 'unique', options.warmS);
    const base = join(target.profilesDir, `${target.stamp}-${adapter}-${variant}`);
    const raw = `${base}.cpuprofile`;
    await server.startProfile();
    await server.reset();
    await load(variant, 'unique', options.profileS);
    const stats = await server.settledStats();
    await server.stopProfile(raw);
    const text = await readFile(raw, 'utf8');
    const parsed = JSON.parse(text) as CpuProfile;
    await writeFile(`${raw}.gz`, gzipSync(text));
    await rm(raw);
    cpu.profiles[variant] = `${raw}.gz`;
    cpu[variant] = attributeCpu(parsed, stats.requests);
    if (FLAME_GRAPHS.includes(variant)) {
      const svg = `${base}.flame.svg`;
      await writeFile(
        svg,
        renderFlameGraph(parsed, stats.requests, `${variant} on ${adapter}: CPU per delivery`),
      );
      cpu.flameGraphs[variant] = svg;
    }
    log(
      `${adapter} profile ${variant}: ${cpu[variant]!.cpuUsPerEvent} µs CPU/event, library ` +
        `${cpu[variant]!.libraryUsPerEvent} µs (${(cpu[variant]!.libraryShare * 100).toFixed(1)}%)`,
    );
  }
  return cpu;
}

function describe(cell: CellResult): string {
  const { load, server, database, effect } = cell;
  return (
    `${String(load.eventsPerSecond).padStart(5)} ev/s  p50 ${load.latencyMs.p50} p99 ${load.latencyMs.p99} ms  ` +
    `stmts/ev ${server.statementsPerEvent} rt/ev ${server.roundTripsPerEvent}` +
    (database ? ` db ${database.statementsPerEvent}` : '') +
    `  non2xx ${load.non2xx} err ${load.errors}  double ${effect.double} missing ${effect.missing}`
  );
}
