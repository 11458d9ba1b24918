import type { HandedOffEvent } from '../../interfaces/index.js';
import type { TraceCarrier } from '../../observability/trace-carrier.js';

/** The data of every job `IdempotencyContext.enqueue()` writes: the event, then the handler's data. */
export interface HandoffPayload {
  event: HandedOffEvent;
  data: unknown;
  /** The enqueuing delivery's trace context, which the worker's span continues (with OpenTelemetry). */
  trace?: TraceCarrier;
}

/** The payload for `event` and the handler's `data` (undefined is stored as null, as JSON has it). */
export function handoffPayload(event: HandedOffEvent, data: unknown, trace?: TraceCarrier): HandoffPayload {
  const payload: HandoffPayload = {
    event: { key: event.key, scope: event.scope, source: event.source },
    data: data ?? null,
  };
  if (trace) payload.trace = trace;
  return payload;
}

/** The payload of a job's data, or null for a job that was not written by enqueue(). */
export function readHandoffPayload(data: unknown): HandoffPayload | null {
  const event = (data as { event?: Partial<HandedOffEvent> } | null)?.event;
  if (
    typeof event?.key !== 'string' ||
    event.key.length === 0 ||
    typeof event.scope !== 'string' ||
    typeof event.source !== 'string'
  ) {
    return null;
  }
  return data as HandoffPayload;
}
