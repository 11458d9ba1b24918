import type { Meter, ObservableCallback } from '@opentelemetry/api';
import type { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { HandoffMetrics } from '../transports/queue/handoff-metrics.js';
import { METRICS } from './telemetry-names.js';

/** The queue states of `idempotency.queue.jobs`, as QueueStats has them → their label values. */
const QUEUE_STATES = [
  ['queued', 'queued'],
  ['retrying', 'retrying'],
  ['active', 'active'],
  ['failed', 'failed'],
  ['deadLettered', 'dead_lettered'],
] as const;

/**
 * The counters and gauges on an OpenTelemetry meter, read from the in-process totals when the
 * meter collects (observable instruments): a delivery pays nothing for them. Each carries the
 * attributes its prom-client twin has as labels (see METRICS). Returns what removes the callbacks.
 */
export function observeTotals(meter: Meter, claims: IdempotencyMetrics, handoff: HandoffMetrics): () => void {
  const registered: (() => void)[] = [];
  const instrument = (
    kind: 'counter' | 'gauge',
    metric: (typeof METRICS)[keyof typeof METRICS],
    description: string,
  ) => {
    const observable =
      kind === 'counter'
        ? meter.createObservableCounter(metric.openTelemetry, { description, unit: metric.unit })
        : meter.createObservableGauge(metric.openTelemetry, { description, unit: metric.unit });
    return {
      addCallback(callback: ObservableCallback) {
        observable.addCallback(callback);
        registered.push(() => observable.removeCallback(callback));
      },
    };
  };

  instrument('counter', METRICS.claims, 'Deliveries by idempotency outcome').addCallback((result) => {
    for (const [scope, outcomes] of Object.entries(claims.snapshot().claims)) {
      for (const [outcome, total] of Object.entries(outcomes)) result.observe(total ?? 0, { scope, outcome });
    }
  });
  instrument(
    'gauge',
    METRICS.expiredLeases,
    'In-progress claims whose lease expired (their worker probably died), at the last report',
  ).addCallback((result) => result.observe(claims.snapshot().expiredLeases));
  instrument(
    'gauge',
    METRICS.poisonEvents,
    'Claims not done after maxAttempts attempts (at most 100), at the last report',
  ).addCallback((result) => result.observe(claims.snapshot().poisonEvents));
  instrument('counter', METRICS.jobs, 'Handoff jobs run by this process, by queue and outcome').addCallback(
    (result) => {
      for (const [queue, outcomes] of Object.entries(handoff.snapshot().jobs)) {
        for (const [outcome, total] of Object.entries(outcomes))
          result.observe(total ?? 0, { queue, outcome });
      }
    },
  );
  instrument('gauge', METRICS.queueJobs, 'Handoff jobs by queue and state, at the last report').addCallback(
    (result) => {
      for (const [queue, stats] of Object.entries(handoff.snapshot().queues)) {
        for (const [field, state] of QUEUE_STATES) result.observe(stats[field], { queue, state });
      }
    },
  );
  instrument(
    'gauge',
    METRICS.queueOldestWaiting,
    'Age of the oldest handoff job waiting in each queue, at the last report',
  ).addCallback((result) => {
    for (const [queue, stats] of Object.entries(handoff.snapshot().queues)) {
      result.observe(stats.oldestWaitingMs / 1000, { queue });
    }
  });
  // An app that closes stops reporting: the meter is the process's, and may outlive the app.
  return () => {
    for (const remove of registered) remove();
  };
}
