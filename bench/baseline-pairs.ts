import { BASELINE_PAIRS, type Pair } from './variants.js';

/** A pair of BASELINE_PAIRS the baseline cannot run: a route it lacks (a variant added after it). */
export interface SkippedPair {
  pair: string;
  /** The pair's variants the baseline's bench server has no route for. */
  missing: string[];
}

/** Which pairs of BASELINE_PAIRS run on both servers, and which on the current server alone. */
export interface BaselinePairs {
  measured: Pair[];
  skipped: SkippedPair[];
}

/**
 * Splits `pairs` by the variants the baseline's bench serves (its own VARIANTS): a pair runs on
 * both servers when the baseline has both its routes, and otherwise on the current server alone,
 * named in `skipped`, so an older commit compares on what it has instead of failing its warm-up.
 * With `baselineVariants` unknown (a bench too old to say), every pair is measured, as before.
 * @default pairs BASELINE_PAIRS
 */
export function baselinePairs(
  baselineVariants: readonly string[] | undefined,
  pairs: readonly Pair[] = BASELINE_PAIRS,
): BaselinePairs {
  if (!baselineVariants) return { measured: [...pairs], skipped: [] };
  const measured: Pair[] = [];
  const skipped: SkippedPair[] = [];
  for (const pair of pairs) {
    const missing = [pair.lib, pair.raw].filter((variant) => !baselineVariants.includes(variant));
    if (missing.length === 0) measured.push(pair);
    else skipped.push({ pair: pair.name, missing });
  }
  return { measured, skipped };
}

/**
 * What a baseline skipped, after its name (`b4753f6 has no lib-request, raw-request route:
 * lib-request/raw-request runs on the current server alone`), or undefined when it skipped nothing.
 */
export function skippedLine(name: string, skipped: readonly SkippedPair[]): string | undefined {
  if (skipped.length === 0) return undefined;
  const missing = [...new Set(skipped.flatMap((entry) => entry.missing))];
  const pairs = skipped.map((entry) => entry.pair);
  return (
    `${name} has no ${missing.join(', ')} route: ` +
    `${pairs.join(', ')} ${pairs.length === 1 ? 'runs' : 'run'} on the current server alone`
  );
}
