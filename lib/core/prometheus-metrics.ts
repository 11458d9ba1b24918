import type { IdempotencyConfig } from '../interfaces/index.js';
import { loadOptionalPeer } from './optional-peer.js';

/** The prom-client counter surface used here, so prom-client stays an optional peer. */
export interface PromCounter {
  inc(labels: Record<string, string>): void;
}

/** The prom-client gauge surface used here: set with labels, or without for a gauge that has none. */
export interface PromGauge {
  set(value: number): void;
  set(labels: Record<string, string>, value: number): void;
}

/** The prom-client histogram surface used here (the duration histograms, lib/observability/). */
export interface PromHistogram {
  observe(labels: Record<string, string>, value: number): void;
}

/** Gets or makes the library's metrics in the registries the `prometheus` option names. */
export interface PromMetrics {
  counter(name: string, help: string, labelNames: string[]): PromCounter;
  gauge(name: string, help: string, labelNames?: string[]): PromGauge;
  histogram(name: string, help: string, labelNames: string[], buckets: number[]): PromHistogram;
}

/**
 * The registries of the `prometheus` option (default: prom-client's default registry), or
 * undefined when the option is `false` or prom-client is not installed (an optional peer: then
 * only the in-process totals report). Several apps (tests, workers) may share one registry, so a
 * metric registered there before is reused rather than registered twice.
 */
export async function prometheusMetrics(
  option: IdempotencyConfig['prometheus'],
): Promise<PromMetrics | undefined> {
  if (option === false) return undefined;
  let prom: typeof import('prom-client');
  try {
    prom = await loadOptionalPeer<typeof import('prom-client')>('prom-client');
  } catch {
    return undefined;
  }
  const registers = (
    option === true ? [prom.register] : option.registers
  ) as import('prom-client').Registry[];
  const existing = (name: string) => registers[0]?.getSingleMetric(name);
  return {
    counter: (name, help, labelNames) =>
      (existing(name) ?? new prom.Counter({ name, help, labelNames, registers })) as unknown as PromCounter,
    gauge: (name, help, labelNames = []) =>
      (existing(name) ?? new prom.Gauge({ name, help, labelNames, registers })) as unknown as PromGauge,
    histogram: (name, help, labelNames, buckets) =>
      (existing(name) ??
        new prom.Histogram({ name, help, labelNames, buckets, registers })) as unknown as PromHistogram,
  };
}
