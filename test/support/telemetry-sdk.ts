import { context, metrics, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  AggregationTemporality,
  MeterProvider,
  MetricReader,
  type DataPoint,
  type Histogram,
  type MetricData,
} from '@opentelemetry/sdk-metrics';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from '@opentelemetry/sdk-trace-base';
import { waitUntil } from './wait-until.js';

/** A reader the test collects from when it wants (no timer): cumulative, as Prometheus scrapes. */
class OnDemandReader extends MetricReader {
  constructor() {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE });
  }
  protected override onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
  protected override onShutdown(): Promise<void> {
    return Promise.resolve();
  }
}

/** The real OpenTelemetry SDK, recording in memory: what an app's NodeSDK would export. */
export interface TelemetrySdk {
  /** Every span ended so far. */
  spans(): ReadableSpan[];
  /** Waits until `count` ended spans match `filter`, and returns them (in end order). */
  waitForSpans(filter: (span: ReadableSpan) => boolean, count?: number): Promise<ReadableSpan[]>;
  /** Forgets the spans ended so far. */
  reset(): void;
  /** Collects the meter's metrics now, by instrument name. */
  collect(): Promise<Map<string, MetricData>>;
}

/**
 * Registers the SDK globally for this test file (Jest gives each file its own globals): a tracer
 * provider with an in-memory exporter, Node's AsyncLocalStorage context manager (which NodeSDK
 * registers too) and a meter provider. Call it before any app boots: the library takes its meter
 * at init.
 */
export function installTelemetrySdk(): TelemetrySdk {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(provider);
  const reader = new OnDemandReader();
  metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
  return {
    spans: () => exporter.getFinishedSpans(),
    async waitForSpans(filter, count = 1) {
      let found: ReadableSpan[] = [];
      await waitUntil(
        () => (found = exporter.getFinishedSpans().filter(filter)).length >= count,
        `${count} span(s) to end`,
      );
      return found;
    },
    reset: () => exporter.reset(),
    async collect() {
      const { resourceMetrics } = await reader.collect();
      const byName = new Map<string, MetricData>();
      for (const scope of resourceMetrics.scopeMetrics) {
        for (const metric of scope.metrics) byName.set(metric.descriptor.name, metric);
      }
      return byName;
    },
  };
}

/** The data point of `metric` whose attributes include `attributes`. */
export function pointWith<T>(
  metric: MetricData | undefined,
  attributes: Record<string, string>,
): DataPoint<T> | undefined {
  return (metric?.dataPoints as DataPoint<T>[] | undefined)?.find((point) =>
    Object.entries(attributes).every(([name, value]) => point.attributes[name] === value),
  );
}

/** How many recordings a histogram data point holds. */
export const histogramCount = (point: DataPoint<Histogram> | undefined) => point?.value.count ?? 0;
