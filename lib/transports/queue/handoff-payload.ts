import type { HandedOffEvent } from '../../interfaces/index.js';
import type { TraceCarrier } from '../../observability/trace-carrier.js';

/**
 * The data of every job `IdempotencyContext.enqueue()` writes: the event, the job's key, then the
 * handler's data.
 */
export interface HandoffPayload {
  event: HandedOffEvent;
  /**
   * What the worker claims the job under: `enqueue()`'s `key` option, else the job's id, chosen
   * at enqueue. Kept in the data, so that a copy of the job (a dead letter moved back) is the same
   * job to its claim. Absent from jobs an earlier version wrote: their id stands in (jobKeyOf).
   */
  key?: string;
  data: unknown;
  /** The enqueuing delivery's trace context, which the worker's span continues (with OpenTelemetry). */
  trace?: TraceCarrier;
}

/**
 * The payload for `event`, the job's `key` and the handler's `data` (undefined is stored as null,
 * as JSON has it).
 */
export function handoffPayload(
  event: HandedOffEvent,
  key: string,
  data: unknown,
  trace?: TraceCarrier,
): HandoffPayload {
  const payload: HandoffPayload = {
    event: { key: event.key, scope: event.scope, source: event.source },
    key,
    data: data ?? null,
  };
  if (trace) payload.trace = trace;
  return payload;
}

/** The payload of a job's data, or null for a job that was not written by enqueue(). */
export function readHandoffPayload(data: unknown): HandoffPayload | null {
  const payload = data as { event?: Partial<HandedOffEvent>; key?: unknown } | null;
  const event = payload?.event;
  if (
    typeof event?.key !== 'string' ||
    event.key.length === 0 ||
    typeof event.scope !== 'string' ||
    typeof event.source !== 'string' ||
    (payload!.key !== undefined && (typeof payload!.key !== 'string' || payload!.key.length === 0))
  ) {
    return null;
  }
  return data as HandoffPayload;
}

/** The key a worker claims a job under: its payload's, or, for a job written without one, its id. */
export function jobKeyOf(payload: HandoffPayload, jobId: string): string {
  return payload.key ?? jobId;
}
