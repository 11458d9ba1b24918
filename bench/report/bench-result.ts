import type { BenchOptions } from '../bench-options.js';
import type { LoadResult } from '../load/load-run.js';
import type { StormResult } from '../load/storm.js';
import type { QueryCounts, TracedQuery } from '../server/query-counter.js';
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

/** What one traced delivery sent to the database. */
export interface Trace {
  status: number;
  queries: TracedQuery[];
}

/** Everything measured on one adapter. */
export interface AdapterResult {
  adapter: string;
  startedAt: string;
  finishedAt: string;
  traces: Record<Variant, { first: Trace; duplicate: Trace }>;
  /** Does the library send more round trips than the hand-written SQL on the happy path? */
  happyPath: Record<
    'lib-tx vs raw-tx' | 'lib-external vs raw-lease',
    { lib: number; raw: number; extra: number }
  >;
  cells: CellResult[];
  ratios: Record<string, RatioResult>;
  storm: StormResult[];
  cpu: { profiles: Record<string, string>; 'lib-tx'?: CpuAttribution; 'raw-tx'?: CpuAttribution } | null;
  serverLog: { lines: number; tail: string[] };
}

/** A whole run: one or both adapters. */
export interface BenchRun {
  mode: BenchOptions['mode'];
  options: BenchOptions;
  environment: Record<string, string | number>;
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
    cpu: result.cpu?.['lib-tx'] && {
      libTxCpuUsPerEvent: result.cpu['lib-tx'].cpuUsPerEvent,
      rawTxCpuUsPerEvent: result.cpu['raw-tx']?.cpuUsPerEvent ?? null,
      libraryUsPerEvent: result.cpu['lib-tx'].libraryUsPerEvent,
      libraryShare: result.cpu['lib-tx'].libraryShare,
      libraryInclusiveShare: result.cpu['lib-tx'].libraryInclusiveShare,
    },
  };
}
