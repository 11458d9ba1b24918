import type { SkippedPair } from '../baseline-pairs.js';
import type { BenchOptions } from '../bench-options.js';
import type { LoadResult } from '../load/load-run.js';
import type { StormResult } from '../load/storm.js';
import type { QueryCounts, TracedQuery } from '../server/query-counter.js';
import type { DelayProxyStats } from '../support/delay-proxy-process.js';
import type { ExecutedStatements } from '../support/statement-stats.js';
import type { Variant, Workload } from '../variants.js';
import type { CpuAttribution } from './cpu-attribution.js';

/** One variant under one workload. */
export interface CellResult {
  variant: Variant;
  workload: Workload;
  load: Omit<LoadResult, 'answeredIds'>;
  /** Counted inside the bench server while it answered this cell's deliveries. */
  server: {
    /** Deliveries received: the denominator of every "per event" figure. */
    received: number;
    answered: number;
    statuses: Record<string, number>;
    cpuUsPerEvent: number;
    queries: QueryCounts;
    statementsPerEvent: number;
    roundTripsPerEvent: number;
    /** ReadyForQuery messages per event: the round trips as the wire saw them. */
    wireRoundTripsPerEvent: number;
  };
  /** pg_stat_statements for the bench database (null when it is not available). */
  database:
    | (Omit<ExecutedStatements, 'statements'> & {
        statementsPerEvent: number;
        execUsPerEvent: number;
        /**
         * The database server's CPU per event, every process of it (DatabaseCpu): null when the
         * server is not on this machine.
         */
        cpuUsPerEvent: number | null;
        statements: ExecutedStatements['statements'];
      })
    | null;
  /** Order rows against the events answered 2xx (double: rows beyond one per event; missing: answered 2xx without a row). */
  effect: { orderRows: number; distinctOrders: number; answeredIds: number; double: number; missing: number };
}

/** One interleaved repetition of a headline pair. */
export interface RatioRep {
  first: Variant;
  libEventsPerSecond: number;
  rawEventsPerSecond: number;
  ratio: number;
  libP50Ms: number;
  rawP50Ms: number;
}

/** Interleaved throughput ratios of one pair. */
export interface RatioResult {
  median: number;
  min: number;
  max: number;
  values: number[];
  reps: RatioRep[];
}

/** Median, min and max over the repetitions, and every repetition's value. */
export interface Spread {
  median: number;
  min: number;
  max: number;
  values: number[];
}

/** One side of a baseline repetition: which server, which route, what it did. */
export interface BaselineSide {
  side: 'current' | 'baseline';
  variant: Variant;
  eventsPerSecond: number;
  p50Ms: number;
  /** non-2xx answers plus socket errors and timeouts; 0 is expected (all keys unique). */
  errors: number;
}

/** One repetition of a pair on both servers (BASELINE_PAIRS): four runs, in `sides` order. */
export interface BaselineRep {
  sides: BaselineSide[];
  /** current lib / current raw, baseline lib / baseline raw, current lib / baseline lib, current raw / baseline raw. */
  current: number;
  baseline: number;
  direct: number;
  directRaw: number;
}

/** A pair measured on the current code and on the baseline's, interleaved (BASELINE_PAIRS). */
export interface BaselinePairResult {
  /** lib/raw in the current server (the same repetitions as the headline ratio). */
  current: Spread;
  /** lib/raw in the baseline server: its own ratio against the same hand-written SQL. */
  baseline: Spread;
  /** current lib / baseline lib, within each repetition. */
  direct: Spread;
  /** current raw / baseline raw: the same hand-written SQL in both, so this shows the noise between the two processes. */
  directRaw: Spread;
  reps: BaselineRep[];
}

/** Which code the baseline is, and how its server ran (`--baseline`). */
export interface BaselineInfo {
  ref: string;
  commit: string;
  subject: string;
  current: { commit: string; dirty: boolean };
  /** shared: on the current side's database (same schema); own: a fresh one made by the baseline's code. */
  database: 'shared' | 'own';
  /** bench/server or its protocol differ from the current ones (then raw-* are not the same code on both sides). */
  serverChanged: boolean;
  /** Seconds of load per variant of BASELINE_PAIRS on the baseline server before the repetitions. */
  warmS: number;
  /** Pairs of BASELINE_PAIRS the baseline lacks a route of: measured on the current server alone. */
  skipped: SkippedPair[];
}

/** What one traced delivery sent to the database. */
export interface Trace {
  status: number;
  queries: TracedQuery[];
}

/** Async work per delivery of one variant, from the bench server's async-hooks counter. */
export interface AsyncWork {
  /** Deliveries counted (sequential, on one keep-alive connection). */
  deliveries: number;
  /** Promises created per delivery. */
  promises: number;
  /** Other async resources per delivery (ticks, immediates, timers, sockets' requests, ...). */
  resources: number;
  /** Every type, per delivery. */
  byType: Record<string, number>;
}

/** How the bench server's library prepares its statements: its default, or `preparedStatements: false`. */
export type PreparedMode = 'prepared' | 'unprepared';

/** One run of one route in a network-path repetition. */
export interface PathSide {
  path: string;
  prepared: PreparedMode;
  variant: Variant;
  workload: Workload;
  eventsPerSecond: number;
  p50Ms: number;
  /** non-2xx answers plus socket errors and timeouts; 0 is expected. */
  errors: number;
}

/** lib/raw of one pair on one path and workload, on the server with the library's defaults. */
export interface PathRatio extends Spread {
  path: string;
  delayMs: number | null;
  pair: string;
  workload: Workload;
  /** The same ratio on the `preparedStatements: false` server (`--unprepared`, not on the 0 ms control). */
  unprepared?: Spread;
}

/** What `preparedStatements: false` costs one pair's library side on one path (all keys unique). */
export interface PreparedCost {
  path: string;
  delayMs: number | null;
  pair: string;
  /** lib unprepared / lib prepared, within each repetition. */
  lib: Spread;
  /** raw on the unprepared server / raw on the prepared one: the same code in two processes, the noise. */
  control: Spread;
}

/** `--latency-ms` / `--unprepared`: the headline pairs on loopback and through delay proxies. */
export interface NetworkPathsResult {
  paths: { name: string; delayMs: number | null }[];
  /** Each proxy over the whole comparison: what it passed, its CPU, how long chunks really waited. */
  proxies: { delayMs: number; stats: DelayProxyStats }[];
  ratios: PathRatio[];
  prepared: PreparedCost[];
  /** One new event and a duplicate through the unprepared server's library routes. */
  unpreparedTraces?: Partial<Record<Variant, { first: Trace; duplicate: Trace }>>;
  /** Every run, in the order run. */
  reps: PathSide[][];
  /** Output of the servers started for the comparison (errors and warnings). */
  serverLogs: { server: string; lines: number; tail: string[] }[];
}

/** Everything measured on one adapter. */
export interface AdapterResult {
  adapter: string;
  startedAt: string;
  finishedAt: string;
  traces: Record<Variant, { first: Trace; duplicate: Trace }>;
  /** Promises and async resources per delivery, new keys and replays (deterministic per build). */
  asyncWork?: Record<Variant, { unique: AsyncWork; duplicate: AsyncWork }>;
  /** Does the library send more round trips than the hand-written SQL on the happy path? */
  happyPath: Record<
    'lib-tx vs raw-tx' | 'lib-external vs raw-lease' | 'lib-tx-ordered vs lib-tx',
    { lib: number; raw: number; extra: number }
  >;
  cells: CellResult[];
  ratios: Record<string, RatioResult>;
  storm: StormResult[];
  /**
   * A CPU profile of every variant under the same load (gzipped .cpuprofile files), attributed by
   * code location, and flame graphs (SVG) of lib-tx and raw-tx-intercepted.
   */
  cpu:
    | ({ profiles: Record<string, string>; flameGraphs: Record<string, string> } & Partial<
        Record<Variant, CpuAttribution>
      >)
    | null;
  serverLog: { lines: number; tail: string[] };
  /** `--baseline` only: the pairs of BASELINE_PAIRS on both servers, by pair name. */
  baseline?: Record<string, BaselinePairResult>;
  /** `--baseline` only: the baseline server's output (errors and warnings). */
  baselineServerLog?: { lines: number; tail: string[] };
  /** `--latency-ms` / `--unprepared` only. */
  paths?: NetworkPathsResult;
}

/** A whole run: one or both adapters. */
export interface BenchRun {
  mode: BenchOptions['mode'];
  options: BenchOptions;
  environment: Record<string, string | number>;
  /** `--baseline` only. */
  baseline?: BaselineInfo;
  adapters: AdapterResult[];
}

const KEYS = ['raw-tx', 'lib-tx', 'raw-lease', 'lib-external'] as const;

/** The fields issue 5 asks latest.json for, for one adapter. */
export function summarize(result: AdapterResult) {
  const unique = (variant: Variant) =>
    result.cells.find((cell) => cell.variant === variant && cell.workload === 'unique');
  const libStorm = result.storm.find((storm) => storm.variant === 'lib-tx') ?? result.storm[0];
  return {
    adapter: result.adapter,
    ratios: Object.fromEntries(
      Object.entries(result.ratios).map(([pair, { median, min, max }]) => [pair, { median, min, max }]),
    ),
    statementsPerEvent: Object.fromEntries(
      KEYS.map((key) => [key, unique(key)?.server.statementsPerEvent ?? null]),
    ),
    roundTripsPerEvent: Object.fromEntries(
      KEYS.map((key) => [key, unique(key)?.server.roundTripsPerEvent ?? null]),
    ),
    databaseStatementsPerEvent: Object.fromEntries(
      KEYS.map((key) => [key, unique(key)?.database?.statementsPerEvent ?? null]),
    ),
    happyPath: result.happyPath,
    eventsPerSecond: Object.fromEntries(
      result.cells.map((cell) => [`${cell.variant}/${cell.workload}`, cell.load.eventsPerSecond]),
    ),
    storm: libStorm && {
      variant: libStorm.variant,
      unrelatedP99CalmMs: libStorm.unrelatedCalm.p99,
      unrelatedP99StormMs: libStorm.unrelatedStorm.p99,
      ratio: libStorm.p99Ratio,
      duplicateAnswers: libStorm.duplicates.answers,
    },
    ...(result.baseline && {
      baseline: Object.fromEntries(
        Object.entries(result.baseline).map(([pair, { current, baseline, direct, directRaw }]) => [
          pair,
          Object.fromEntries(
            Object.entries({ current, baseline, direct, directRaw }).map(([name, { median, min, max }]) => [
              name,
              { median, min, max },
            ]),
          ),
        ]),
      ),
    }),
    cpu: result.cpu?.['lib-tx'] && {
      libTxCpuUsPerEvent: result.cpu['lib-tx'].cpuUsPerEvent,
      rawTxCpuUsPerEvent: result.cpu['raw-tx']?.cpuUsPerEvent ?? null,
      libraryUsPerEvent: result.cpu['lib-tx'].libraryUsPerEvent,
      libraryShare: result.cpu['lib-tx'].libraryShare,
      libraryInclusiveShare: result.cpu['lib-tx'].libraryInclusiveShare,
    },
  };
}
