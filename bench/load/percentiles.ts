/** Latency summary in milliseconds. */
export interface LatencySummary {
  count: number;
  p50: number;
  p99: number;
  max: number;
  mean: number;
}

/** Nearest-rank percentile of sorted values (0 for none). */
export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return 0;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))];
}

/** p50/p99/max/mean of raw latencies, rounded to 0.01 ms. */
export function summarize(latencies: number[]): LatencySummary {
  const sorted = Float64Array.from(latencies).sort();
  const values = Array.from(sorted);
  const mean = values.length ? values.reduce((sum, value) => sum + value, 0) / values.length : 0;
  return {
    count: values.length,
    p50: round(percentile(values, 50)),
    p99: round(percentile(values, 99)),
    max: round(values.at(-1) ?? 0),
    mean: round(mean),
  };
}

/** Median, min and max of a set of ratios. */
export function spread(values: number[]): { median: number; min: number; max: number; values: number[] } {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length / 2;
  const median = sorted.length % 2 ? sorted[Math.floor(middle)] : (sorted[middle - 1] + sorted[middle]) / 2;
  return {
    median: round(median, 3),
    min: round(sorted[0], 3),
    max: round(sorted.at(-1)!, 3),
    values: values.map((value) => round(value, 3)),
  };
}

/** Rounds to `digits` decimals (2 by default). */
export function round(value: number, digits = 2): number {
  const factor = 10 ** digits;
  return Math.round(value * factor) / factor;
}
