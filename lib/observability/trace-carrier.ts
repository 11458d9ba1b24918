import type { Context } from '@opentelemetry/api';
import type { OpenTelemetry } from './open-telemetry.js';

/**
 * The trace context a handed-off job carries from the delivery that enqueued it to the worker
 * that runs it: W3C Trace Context's `traceparent` and `tracestate` headers, as strings.
 */
export interface TraceCarrier {
  traceparent: string;
  tracestate?: string;
}

/** `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, version 00 of W3C Trace Context. */
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/**
 * The carrier of the span active in `context`, or undefined when none is (or it is invalid).
 * Written by the library itself rather than by the app's global propagator: both ends of a job
 * are the library's, so the job carries the trace whether or not the app registered a W3C
 * propagator (an SDK set up for B3 only, or none at all, would otherwise leave it empty).
 */
export function traceCarrier(api: OpenTelemetry, context: Context): TraceCarrier | undefined {
  const span = api.trace.getSpanContext(context);
  if (!span || !api.isSpanContextValid(span)) return undefined;
  const flags = (span.traceFlags & 0xff).toString(16).padStart(2, '0');
  const state = span.traceState?.serialize();
  return {
    traceparent: `00-${span.traceId}-${span.spanId}-${flags}`,
    ...(state ? { tracestate: state } : {}),
  };
}

/**
 * The context a worker continues from: the carrier's span as a remote parent in ROOT_CONTEXT, or
 * undefined when the job carries none (a job enqueued before tracing was on, or by hand) or one
 * that does not parse.
 */
export function continuedContext(api: OpenTelemetry, carrier: unknown): Context | undefined {
  const { traceparent, tracestate } = (carrier ?? {}) as Partial<TraceCarrier>;
  const parts = typeof traceparent === 'string' ? TRACEPARENT.exec(traceparent) : null;
  if (!parts) return undefined;
  const spanContext = {
    traceId: parts[1]!,
    spanId: parts[2]!,
    traceFlags: parseInt(parts[3]!, 16),
    isRemote: true,
    ...(typeof tracestate === 'string' && tracestate ? { traceState: api.createTraceState(tracestate) } : {}),
  };
  if (!api.isSpanContextValid(spanContext)) return undefined;
  return api.trace.setSpanContext(api.ROOT_CONTEXT, spanContext);
}
