import { Inject, Injectable, type OnModuleDestroy, type OnModuleInit } from '@nestjs/common';
import type { Histogram } from '@opentelemetry/api';
import type { IdempotentDelivery } from '../core/claim-delivery.js';
import type { ClaimResult } from '../core/claim-result.js';
import type { ClaimSpec } from '../core/claim-strategy.js';
import { prometheusMetrics, type PromHistogram } from '../core/prometheus-metrics.js';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import { EventInFlightError, IdempotencyUnavailableError } from '../idempotency.errors.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import { HandoffMetrics } from '../transports/queue/handoff-metrics.js';
import type { DeliveryOrigin } from './delivery-origin.js';
import { DeliveryTracing, type DeliverySpan } from './delivery-tracing.js';
import { observeTotals } from './observable-metrics.js';
import { INSTRUMENTATION_NAME, loadOpenTelemetry } from './open-telemetry.js';
import { METRICS, type DeliveryResult } from './telemetry-names.js';
import { resolveTelemetryOptions } from './telemetry-options.js';
import type { TraceCarrier } from './trace-carrier.js';

/** When one delivery's handler ran, by performance.now(); 0 while it has not. */
interface HandlerTiming {
  started: number;
  ended: number;
  failed: boolean;
}

/** The two histograms, on prom-client or an OpenTelemetry meter. */
interface DurationSinks {
  claim(scope: string, result: DeliveryResult, seconds: number): void;
  handler(scope: string, result: 'ok' | 'error', seconds: number): void;
}

/**
 * What a delivery reports beyond its counted outcome: how long its claim and its handler took
 * (`idempotency_claim_duration_seconds` and `idempotency_handler_duration_seconds`, on prom-client
 * and, with `@opentelemetry/api`, on its meter), and its span. The claim runner sends every
 * delivery through `observe()` while `enabled`; with neither prom-client nor `@opentelemetry/api`
 * installed it is not, and a delivery pays one check.
 *
 * The claim's duration runs from the delivery reaching the library until its claim was answered:
 * until the handler starts, or until a replay, an in-flight answer or a failure is. The handler's
 * runs from its start until it returns or throws; the commit comes after it.
 */
@Injectable()
export class DeliveryTelemetry implements OnModuleInit, OnModuleDestroy {
  /** True once a histogram or the tracer is there: the claim runner then calls observe(). */
  enabled = false;
  private tracing?: DeliveryTracing;
  private readonly sinks: DurationSinks[] = [];
  private stopObserving?: () => void;

  constructor(
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly metrics: IdempotencyMetrics,
    private readonly handoffMetrics: HandoffMetrics,
  ) {}

  async onModuleInit(): Promise<void> {
    const { openTelemetry, durationBuckets } = resolveTelemetryOptions(this.config.telemetry);
    const prom = await prometheusMetrics(this.config.prometheus);
    if (prom) {
      const claim = prom.histogram(
        METRICS.claimDuration.prometheus,
        'Time from a delivery reaching the library until its claim was answered (handler started, replayed, in flight, failed)',
        ['scope', 'result'],
        durationBuckets,
      );
      const handler = prom.histogram(
        METRICS.handlerDuration.prometheus,
        'Time an idempotent handler ran, from its claim to its return or throw (the commit excluded)',
        ['scope', 'result'],
        durationBuckets,
      );
      this.sinks.push(promSinks(claim, handler));
    }
    const api = openTelemetry ? await loadOpenTelemetry() : undefined;
    if (api) {
      const tracing = new DeliveryTracing(api);
      this.tracing = tracing;
      this.metrics.outcomeListener = (outcome, scope, key) => tracing.outcome(outcome, scope, key);
      const meter = api.metrics.getMeter(INSTRUMENTATION_NAME);
      const histogram = (
        metric: typeof METRICS.claimDuration | typeof METRICS.handlerDuration,
        description: string,
      ) =>
        meter.createHistogram(metric.openTelemetry, {
          description,
          unit: metric.unit,
          advice: { explicitBucketBoundaries: durationBuckets },
        });
      this.sinks.push(
        otelSinks(
          histogram(
            METRICS.claimDuration,
            'Time from a delivery reaching the library until its claim was answered',
          ),
          histogram(METRICS.handlerDuration, 'Time an idempotent handler ran (the commit excluded)'),
        ),
      );
      this.stopObserving = observeTotals(meter, this.metrics, this.handoffMetrics);
    }
    this.enabled = this.sinks.length > 0;
  }

  onModuleDestroy(): void {
    this.stopObserving?.();
  }

  /** The trace context for a job enqueued now, or undefined without tracing. */
  carrier(): TraceCarrier | undefined {
    return this.tracing?.carrier();
  }

  /**
   * Runs one delivery (`claim`, the claim runner's own path) with its span and timings: `work`
   * is wrapped to time the handler and run it in its child span.
   */
  observe<T, D extends IdempotentDelivery>(
    spec: ClaimSpec,
    key: string,
    origin: DeliveryOrigin | undefined,
    work: (delivery: D) => Promise<T>,
    claim: (work: (delivery: D) => Promise<T>) => Promise<ClaimResult<T>>,
  ): Promise<ClaimResult<T>> {
    const started = performance.now();
    const timing: HandlerTiming = { started: 0, ended: 0, failed: false };
    const span = this.tracing?.start(spec, key, origin);
    const timed = (delivery: D): Promise<T> => {
      timing.started = performance.now();
      const running = span ? span.runHandler(delivery, () => work(delivery)) : work(delivery);
      return running.then(
        (value) => {
          timing.ended = performance.now();
          return value;
        },
        (error: unknown) => {
          timing.ended = performance.now();
          timing.failed = true;
          throw error;
        },
      );
    };
    let settled: Promise<ClaimResult<T>>;
    try {
      settled = span ? span.within(() => claim(timed)) : claim(timed);
    } catch (error) {
      settled = Promise.reject(error);
    }
    return settled.then(
      (result) => {
        this.finish(spec.scope, started, timing, result.kind, span);
        return result;
      },
      (error: unknown) => {
        this.finish(spec.scope, started, timing, failureResult(error), span, error);
        throw error;
      },
    );
  }

  private finish(
    scope: string,
    started: number,
    timing: HandlerTiming,
    result: DeliveryResult,
    span: DeliverySpan | undefined,
    error?: unknown,
  ): void {
    const claimed = timing.started || performance.now();
    const claimSeconds = (claimed - started) / 1000;
    for (const sink of this.sinks) {
      sink.claim(scope, result, claimSeconds);
      if (timing.started)
        sink.handler(scope, timing.failed ? 'error' : 'ok', (timing.ended - timing.started) / 1000);
    }
    span?.end(result, error);
  }
}

/** The histogram `result` of a delivery that rejected. */
function failureResult(error: unknown): DeliveryResult {
  if (error instanceof IdempotencyUnavailableError) return 'unavailable';
  if (error instanceof EventInFlightError) return 'in_flight';
  return 'failed';
}

function promSinks(claim: PromHistogram, handler: PromHistogram): DurationSinks {
  return {
    claim: (scope, result, seconds) => claim.observe({ scope, result }, seconds),
    handler: (scope, result, seconds) => handler.observe({ scope, result }, seconds),
  };
}

function otelSinks(claim: Histogram, handler: Histogram): DurationSinks {
  return {
    claim: (scope, result, seconds) => claim.record(seconds, { scope, result }),
    handler: (scope, result, seconds) => handler.record(seconds, { scope, result }),
  };
}
