import type { Context, Span, Tracer } from '@opentelemetry/api';
import type { ClaimSpec } from '../core/claim-strategy.js';
import type { IdempotentDelivery } from '../core/claim-delivery.js';
import { originAttributes, type DeliveryOrigin } from './delivery-origin.js';
import { INSTRUMENTATION_NAME, type OpenTelemetry } from './open-telemetry.js';
import { SPAN_ATTRIBUTES as A, type DeliveryResult } from './telemetry-names.js';
import { continuedContext, traceCarrier, type TraceCarrier } from './trace-carrier.js';

/**
 * One delivery's span: `process <scope>` (kind consumer), with a `claim` event when the handler
 * starts, a child span `handler <scope>` around the handler, and a `commit` (transaction mode) or
 * `completion` (external mode) event once the claim is recorded done. Ends with
 * `idempotency.outcome` and, when the delivery failed, the error recorded.
 */
export class DeliverySpan {
  /** The outcome IdempotencyMetrics counted for this delivery, when it was counted in its context. */
  outcome?: string;

  constructor(
    private readonly api: OpenTelemetry,
    private readonly tracer: Tracer,
    readonly span: Span,
    readonly context: Context,
    readonly scope: string,
    readonly key: string,
    private readonly mode: string,
  ) {}

  /** Runs `fn` with this span active: the claim's own spans (pg, TypeORM) become its children. */
  within<T>(fn: () => T): T {
    return this.api.context.with(this.context, fn);
  }

  /** The claim is this delivery's: the handler runs now, in a child span. */
  runHandler<T>(delivery: IdempotentDelivery, fn: () => Promise<T>): Promise<T> {
    const attempt = delivery.attempt;
    if (attempt !== undefined) this.span.setAttribute(A.attempt, attempt);
    this.span.addEvent('claim', attempt !== undefined ? { [A.attempt]: attempt } : undefined);
    const handler = this.tracer.startSpan(
      `handler ${this.scope}`,
      { attributes: { [A.scope]: this.scope } },
      this.context,
    );
    const inHandler = this.api.trace.setSpan(this.context, handler);
    return this.api.context.with(inHandler, fn).then(
      (value) => {
        handler.end();
        return value;
      },
      (error: unknown) => {
        recordError(this.api, handler, error);
        handler.end();
        throw error;
      },
    );
  }

  /** The delivery is over: its outcome (counted, else read from the result) and any error. */
  end(result: DeliveryResult, error?: unknown): void {
    if (result === 'processed') this.span.addEvent(this.mode === 'transaction' ? 'commit' : 'completion');
    this.span.setAttribute(A.outcome, this.outcome ?? FALLBACK_OUTCOMES[result]);
    if (error !== undefined) recordError(this.api, this.span, error);
    this.span.end();
  }
}

/**
 * What the span says when no counted outcome reached it: the app has no context manager (the
 * outcome is counted in the delivery's async context, which only a context manager carries), or
 * the delivery ended before a count.
 */
const FALLBACK_OUTCOMES: Readonly<Record<DeliveryResult, string>> = {
  processed: 'claimed',
  replayed: 'replayed',
  in_flight: 'in_flight',
  stale: 'stale',
  conflict: 'key_conflict',
  failed: 'failed',
  unavailable: 'failed',
};

function recordError(api: OpenTelemetry, span: Span, error: unknown): void {
  span.recordException(error instanceof Error ? error : String(error));
  span.setStatus({
    code: api.SpanStatusCode.ERROR,
    message: error instanceof Error ? error.message : String(error),
  });
}

/**
 * Spans on the app's OpenTelemetry tracer (the API's no-op one until the app registers an SDK):
 * one per delivery, the trace context a handed-off job carries, and the outcome a delivery's
 * count reports in its context.
 */
export class DeliveryTracing {
  private readonly tracer: Tracer;
  /** Open delivery spans → their delivery, to attach the outcome counted in their context. */
  private readonly open = new WeakMap<Span, DeliverySpan>();

  constructor(private readonly api: OpenTelemetry) {
    this.tracer = api.trace.getTracer(INSTRUMENTATION_NAME);
  }

  /**
   * Starts the span of one delivery, the child of the active span or of the job's carrier; or
   * undefined when the tracer is the API's no-op one (no SDK registered: the span records nothing
   * and has no trace id), so that such a delivery makes no handler span and enters no context.
   */
  start(spec: ClaimSpec, key: string, origin: DeliveryOrigin | undefined): DeliverySpan | undefined {
    const { system, destination } = originAttributes(origin, spec.scope);
    const carried =
      origin !== undefined && 'carrier' in origin ? continuedContext(this.api, origin.carrier) : undefined;
    const parent = carried ?? this.api.context.active();
    const span = this.tracer.startSpan(
      `process ${spec.scope}`,
      {
        kind: this.api.SpanKind.CONSUMER,
        attributes: {
          [A.messagingSystem]: system,
          [A.operationType]: 'process',
          [A.operationName]: 'process',
          [A.messageId]: key,
          [A.destination]: destination,
          [A.scope]: spec.scope,
          [A.mode]: spec.mode,
        },
      },
      parent,
    );
    if (!span.isRecording() && !this.api.isSpanContextValid(span.spanContext())) return undefined;
    const delivery = new DeliverySpan(
      this.api,
      this.tracer,
      span,
      this.api.trace.setSpan(parent, span),
      spec.scope,
      key,
      spec.mode,
    );
    this.open.set(span, delivery);
    return delivery;
  }

  /**
   * An outcome was counted: when it is the active delivery's (same scope and key, as a claim
   * made inside a handler counts its own), it becomes the span's `idempotency.outcome`. The last
   * one counted wins: a lease lost after its claim, say.
   */
  outcome(outcome: string, scope: string, key: string): void {
    const active = this.api.trace.getActiveSpan();
    const delivery = active && this.open.get(active);
    if (delivery && delivery.scope === scope && delivery.key === key) delivery.outcome = outcome;
  }

  /** The trace context a job enqueued now carries: the active span (the delivery's handler). */
  carrier(): TraceCarrier | undefined {
    return traceCarrier(this.api, this.api.context.active());
  }
}
