import { parseArgs } from 'node:util';
import type { StormVariant } from './load/storm.js';

export type AdapterName = 'express' | 'fastify';

/** Everything a bench run is shaped by; written into the results. */
export interface BenchOptions {
  mode: 'quick' | 'full';
  adapters: AdapterName[];
  /** autocannon keep-alive connections. */
  connections: number;
  /** pg pool size of the bench server, shared by every variant. */
  poolSize: number;
  /** Seconds of load per cell of the main table, and the warm-up before it. */
  cellS: number;
  warmS: number;
  /** Interleaved repetitions of each headline pair, and seconds per side. */
  reps: number;
  ratioS: number;
  storm: { variants: StormVariant[]; holdMs: number; windowMs: number; rate: number; duplicates: number };
  /** Seconds of profiled load per variant (0: no CPU profile). */
  profileS: number;
  /** The library's concurrentDuplicateWaitMs (undefined: its default). */
  duplicateWaitMs?: number;
  /**
   * A git ref whose library and bench server are measured beside the current ones, interleaved
   * in the headline repetitions (undefined: no baseline).
   */
  baseline?: string;
  /**
   * One-way delays, in ms, of the proxied paths between the app and PostgreSQL measured beside
   * loopback (a 0 ms proxy is added as the control); empty: no proxied paths.
   */
  latencyMs: number[];
  /** Also measure the library with `preparedStatements: false` on every path but the 0 ms control. */
  unprepared: boolean;
  /** Only the traces and the network-path comparison: no tables, headline ratios, storm or profile. */
  pathsOnly: boolean;
}

const USAGE = `npm run bench -- [--quick] [--adapter express|fastify|both] [--connections 32] [--pool 10]
  [--duration S] [--reps N] [--ratio-duration S] [--storm-rate N] [--storm-hold-ms MS]
  [--duplicate-wait-ms MS] [--profile-duration S | --no-profile] [--baseline GIT-REF]
  [--latency-ms MS[,MS...]] [--unprepared] [--paths-only]`;

/** Parses `npm run bench -- ...`; --quick picks short durations for a CI smoke run (< 60 s). */
export function parseBenchOptions(argv: string[]): BenchOptions {
  const { values } = parseArgs({
    args: argv,
    options: {
      quick: { type: 'boolean', default: false },
      adapter: { type: 'string', default: 'both' },
      connections: { type: 'string', default: '32' },
      pool: { type: 'string', default: '10' },
      duration: { type: 'string' },
      reps: { type: 'string' },
      'ratio-duration': { type: 'string' },
      'storm-rate': { type: 'string' },
      'storm-hold-ms': { type: 'string' },
      'duplicate-wait-ms': { type: 'string' },
      'no-profile': { type: 'boolean', default: false },
      'profile-duration': { type: 'string' },
      baseline: { type: 'string' },
      'latency-ms': { type: 'string' },
      unprepared: { type: 'boolean', default: false },
      'paths-only': { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const adapters: AdapterName[] =
    values.adapter === 'both' ? ['express', 'fastify'] : [values.adapter as AdapterName];
  if (!adapters.every((adapter) => adapter === 'express' || adapter === 'fastify')) {
    throw new Error(`--adapter must be express, fastify or both\n${USAGE}`);
  }
  const number = (value: string | undefined, fallback: number) => {
    if (value === undefined) return fallback;
    const parsed = Number(value);
    if (!(parsed >= 0)) throw new Error(`not a number: ${value}\n${USAGE}`);
    return parsed;
  };
  const latencyMs = (values['latency-ms'] ?? '')
    .split(',')
    .filter((value) => value.trim() !== '')
    .map((value) => number(value.trim(), 0))
    // 0 ms is the control, always measured beside the others.
    .filter((delay, index, all) => delay > 0 && all.indexOf(delay) === index)
    .sort((a, b) => a - b);
  if (values['latency-ms'] !== undefined && latencyMs.length === 0) {
    throw new Error(`--latency-ms takes one or more delays above 0 ms, e.g. 0.5\n${USAGE}`);
  }
  if (values['paths-only'] && latencyMs.length === 0 && !values.unprepared) {
    throw new Error(`--paths-only needs --latency-ms or --unprepared\n${USAGE}`);
  }
  if (values['paths-only'] && values.baseline) {
    throw new Error(`--paths-only measures no headline ratios for --baseline to join\n${USAGE}`);
  }
  const quick = values.quick;
  const holdMs = number(values['storm-hold-ms'], quick ? 750 : 7_000);
  return {
    mode: quick ? 'quick' : 'full',
    adapters,
    connections: number(values.connections, 32),
    poolSize: number(values.pool, 10),
    cellS: number(values.duration, quick ? 0.6 : 7),
    warmS: quick ? 0.25 : 1,
    reps: number(values.reps, quick ? 3 : 5),
    ratioS: number(values['ratio-duration'], quick ? 0.6 : 5),
    storm: {
      // Full runs also storm the hand-written transaction, for reference.
      variants: quick ? ['lib-tx'] : ['lib-tx', 'raw-tx', 'lib-external'],
      holdMs,
      windowMs: Math.max(quick ? 1_500 : 10_000, holdMs + 750),
      rate: number(values['storm-rate'], 200),
      duplicates: 32,
    },
    profileS: values['no-profile'] ? 0 : number(values['profile-duration'], quick ? 0 : 6),
    duplicateWaitMs:
      values['duplicate-wait-ms'] === undefined ? undefined : number(values['duplicate-wait-ms'], 0),
    baseline: values.baseline || undefined,
    latencyMs,
    unprepared: values.unprepared,
    pathsOnly: values['paths-only'],
  };
}
