import diagnosticsChannel from 'node:diagnostics_channel';
import { describe, expect, it } from '@jest/globals';
import * as api from '@opentelemetry/api';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import type { ClaimSpec } from '../../lib/core/claim-strategy.js';
import { resolveIdempotencyConfig } from '../../lib/idempotency.config.js';
import { IDEMPOTENCY_CHANNELS } from '../../lib/observability/index.js';
import { DeliveryTracing } from '../../lib/observability/delivery-tracing.js';
import { publishOutcome } from '../../lib/observability/outcome-channels.js';
import {
  DEFAULT_DURATION_BUCKETS,
  resolveTelemetryOptions,
} from '../../lib/observability/telemetry-options.js';
import { continuedContext, traceCarrier } from '../../lib/observability/trace-carrier.js';

describe('the telemetry option', () => {
  it('defaults to OpenTelemetry when installed and the default buckets', () => {
    expect(resolveTelemetryOptions(undefined)).toEqual({
      openTelemetry: true,
      durationBuckets: DEFAULT_DURATION_BUCKETS,
    });
    expect(resolveTelemetryOptions({ openTelemetry: false, durationBuckets: [0.5, 2] })).toEqual({
      openTelemetry: false,
      durationBuckets: [0.5, 2],
    });
  });

  it.each([
    [{ openTelemetry: 'yes' }, 'telemetry.openTelemetry must be true or false, got "yes"'],
    [
      { durationBuckets: [1, 0.5] },
      'telemetry.durationBuckets must be a non-empty array of positive seconds, ascending',
    ],
    [{ durationBuckets: [] }, 'telemetry.durationBuckets must be a non-empty array'],
    [{ durationBuckets: [0, 1] }, 'telemetry.durationBuckets must be'],
    [{ tracing: true }, 'telemetry.tracing is unknown (known: openTelemetry, durationBuckets)'],
  ])('fails the boot for %j', (telemetry, message) => {
    expect(() => resolveIdempotencyConfig({ telemetry: telemetry as never })).toThrow(message);
  });
});

describe('the trace context a handed-off job carries', () => {
  const spanContext = {
    traceId: '0af7651916cd43dd8448eb211c80319c',
    spanId: 'b7ad6b7169203331',
    traceFlags: api.TraceFlags.SAMPLED,
  };

  it("is W3C Trace Context's traceparent and tracestate, and continues as a remote parent", () => {
    const active = api.trace.setSpanContext(api.ROOT_CONTEXT, {
      ...spanContext,
      traceState: api.createTraceState('vendor=value'),
    });
    const carrier = traceCarrier(api, active);
    expect(carrier).toEqual({
      traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
      tracestate: 'vendor=value',
    });
    const continued = api.trace.getSpanContext(continuedContext(api, carrier)!);
    expect(continued).toMatchObject({ ...spanContext, isRemote: true });
    expect(continued?.traceState?.get('vendor')).toBe('value');
  });

  it('is absent without an active span, and ignored when it does not parse', () => {
    expect(traceCarrier(api, api.ROOT_CONTEXT)).toBeUndefined();
    expect(continuedContext(api, undefined)).toBeUndefined();
    expect(continuedContext(api, { traceparent: '00-nothex-b7ad6b7169203331-01' })).toBeUndefined();
    // All-zero ids are invalid in W3C Trace Context.
    expect(
      continuedContext(api, { traceparent: `00-${'0'.repeat(32)}-b7ad6b7169203331-01` }),
    ).toBeUndefined();
  });
});

describe('a delivery span', () => {
  const spec = { scope: 'Tracing.spec', mode: 'transaction' } as ClaimSpec;
  const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';

  it('is not made without an SDK unless a trace is carried in, and is from the moment one registers', () => {
    // Made before any SDK, as the module is at boot in an app that registers its SDK later.
    const tracing = new DeliveryTracing(api);
    expect(tracing.start(spec, 'evt_1', undefined)).toBeUndefined();
    // A handed-off job's trace goes on through a process without an SDK, recording nothing.
    const carried = tracing.start(spec, 'evt_2', {
      system: 'pg-boss',
      destination: 'orders',
      carrier: { traceparent },
    });
    expect(carried?.span.spanContext().traceId).toBe('0af7651916cd43dd8448eb211c80319c');
    expect(carried?.span.isRecording()).toBe(false);

    const exporter = new InMemorySpanExporter();
    api.trace.setGlobalTracerProvider(
      new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }),
    );
    try {
      const recorded = tracing.start(spec, 'evt_3', undefined);
      expect(recorded?.span.isRecording()).toBe(true);
      recorded!.end('processed');
      expect(
        exporter.getFinishedSpans().map((span) => [span.name, span.attributes['messaging.message.id']]),
      ).toEqual([['process Tracing.spec', 'evt_3']]);
    } finally {
      api.trace.disable();
    }
  });
});

describe('the outcome channels', () => {
  it('publish by outcome name, so an outcome counted later (stale) needs no other change', () => {
    const heard: unknown[] = [];
    const listener = (message: unknown) => heard.push(message);
    diagnosticsChannel.subscribe(IDEMPOTENCY_CHANNELS.stale, listener);
    try {
      publishOutcome('stale', 'Orders.handle', 'evt_1');
      publishOutcome('claimed', 'Orders.handle', 'evt_2');
    } finally {
      diagnosticsChannel.unsubscribe(IDEMPOTENCY_CHANNELS.stale, listener);
    }
    expect(heard).toEqual([{ outcome: 'stale', scope: 'Orders.handle', key: 'evt_1' }]);
  });
});
