import pg from 'pg';
import type { AdapterName, BenchOptions } from './bench-options.js';
import type { LoadResult } from './load/load-run.js';
import { round, spread } from './load/percentiles.js';
import type { BaselinePairResult, BaselineRep, BaselineSide } from './report/bench-result.js';
import type { BaselineCheckout } from './support/baseline-checkout.js';
import { ServerProcess } from './support/server-process.js';
import type { Pair, Variant, Workload } from './variants.js';

/** Closed-loop load on one server's route (a fresh id prefix per call). */
export type LoadFn = (variant: Variant, workload: Workload, durationS: number) => Promise<LoadResult>;

/**
 * Seconds of load per route of BASELINE_PAIRS on the baseline server before the repetitions: about what the
 * current server's routes ran before theirs (the warm-up and the unique-key cell), so neither
 * side is measured colder.
 */
export function baselineWarmS(options: BenchOptions): number {
  return options.warmS + options.cellS;
}

/**
 * Starts the baseline's own bench server (its compiled bench/server/main.js, unmodified) on
 * `databaseUrl`, with the current server's settings, and warms the routes of the pairs it runs. Every warm-up
 * answer must be 2xx with its order row in the database: a baseline that fails fast would
 * otherwise look fast.
 */
export async function startBaselineServer(
  checkout: BaselineCheckout,
  adapter: AdapterName,
  options: BenchOptions,
  databaseUrl: string,
  loadOn: (url: string) => LoadFn,
): Promise<{ server: ServerProcess; load: LoadFn }> {
  const server = await ServerProcess.start({
    adapter,
    databaseUrl,
    poolSize: options.poolSize,
    duplicateWaitMs: options.duplicateWaitMs,
    entry: checkout.serverEntry,
  });
  const load = loadOn(server.url);
  try {
    const name = (variant: Variant) => `baseline ${checkout.ref} ${adapter} /${variant}`;
    const routes = [...new Set(checkout.pairs.measured.flatMap((pair) => [pair.lib, pair.raw]))];
    await warmRoutes(load, routes, baselineWarmS(options), databaseUrl, name);
  } catch (error) {
    await server.stop();
    throw new Error(`${(error as Error).message}\n${server.log.lines.join('\n')}`, { cause: error });
  }
  return { server, load };
}

/**
 * Runs each of `variants` for `seconds` on a server (through `load`) and checks that every answer
 * was 2xx with its order row in the database: a server that fails fast would otherwise look fast.
 */
export async function warmRoutes(
  load: LoadFn,
  variants: readonly Variant[],
  seconds: number,
  databaseUrl: string,
  name: (variant: Variant) => string,
): Promise<void> {
  const checker = new pg.Client({ connectionString: databaseUrl });
  await checker.connect();
  try {
    for (const variant of variants) {
      const result = await load(variant, 'unique', seconds);
      const { rows } = await checker.query(
        `SELECT count(*)::int AS n FROM unnest($1::text[]) AS answered(id)
         WHERE NOT EXISTS (SELECT 1 FROM orders WHERE event_id = answered.id)`,
        [result.answeredIds],
      );
      const failed = result.non2xx + result.errors;
      if (failed > 0 || rows[0].n > 0 || result.answeredIds.length === 0) {
        throw new Error(
          `${name(variant)}: ${result.answeredIds.length} answered 2xx, ` +
            `${failed} failed (${JSON.stringify(result.statuses)}), ${rows[0].n} without their order row`,
        );
      }
    }
  } finally {
    await checker.end();
  }
}

/**
 * One repetition of a pair on both servers: current lib, current raw, baseline lib,
 * baseline raw, the order reversed every other repetition so drift falls on all four; the ratios
 * are taken within the repetition.
 */
export async function measureBaselineRep(
  rep: number,
  pair: Pair,
  current: LoadFn,
  baseline: LoadFn,
  durationS: number,
): Promise<BaselineRep> {
  const forward: [BaselineSide['side'], Variant][] = [
    ['current', pair.lib],
    ['current', pair.raw],
    ['baseline', pair.lib],
    ['baseline', pair.raw],
  ];
  const order = rep % 2 === 0 ? forward : [...forward].reverse();
  const sides: BaselineSide[] = [];
  for (const [side, variant] of order) {
    const result = await (side === 'current' ? current : baseline)(variant, 'unique', durationS);
    sides.push({
      side,
      variant,
      eventsPerSecond: result.eventsPerSecond,
      p50Ms: result.latencyMs.p50,
      errors: result.non2xx + result.errors,
    });
  }
  const rate = (side: BaselineSide['side'], variant: Variant) =>
    sides.find((entry) => entry.side === side && entry.variant === variant)!.eventsPerSecond;
  return {
    sides,
    current: rate('current', pair.lib) / rate('current', pair.raw),
    baseline: rate('baseline', pair.lib) / rate('baseline', pair.raw),
    direct: rate('current', pair.lib) / rate('baseline', pair.lib),
    directRaw: rate('current', pair.raw) / rate('baseline', pair.raw),
  };
}

/** Median, min and max of each ratio over the repetitions. */
export function baselinePairResult(reps: BaselineRep[]): BaselinePairResult {
  const of = (name: 'current' | 'baseline' | 'direct' | 'directRaw') => spread(reps.map((rep) => rep[name]));
  return {
    current: of('current'),
    baseline: of('baseline'),
    direct: of('direct'),
    directRaw: of('directRaw'),
    reps: reps.map((rep) => ({
      ...rep,
      current: round(rep.current, 3),
      baseline: round(rep.baseline, 3),
      direct: round(rep.direct, 3),
      directRaw: round(rep.directRaw, 3),
    })),
  };
}
