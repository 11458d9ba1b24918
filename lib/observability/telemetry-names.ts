/**
 * Every metric the library exports, by its prom-client name and its OpenTelemetry instrument
 * name. The OpenTelemetry instruments carry the same attribute names as the Prometheus labels
 * (`scope`, `outcome`, `result`, `queue`, `state`), and their units follow OpenTelemetry's
 * Prometheus naming (a counter gains `_total`, a histogram in `s` gains `_seconds`), so the
 * OpenTelemetry Collector's or SDK's Prometheus exporter writes the very series the shipped
 * dashboard and alert rules read.
 */
export const METRICS = {
  claims: { prometheus: 'idempotency_claims_total', openTelemetry: 'idempotency.claims', unit: '{delivery}' },
  claimDuration: {
    prometheus: 'idempotency_claim_duration_seconds',
    openTelemetry: 'idempotency.claim.duration',
    unit: 's',
  },
  handlerDuration: {
    prometheus: 'idempotency_handler_duration_seconds',
    openTelemetry: 'idempotency.handler.duration',
    unit: 's',
  },
  expiredLeases: {
    prometheus: 'idempotency_expired_leases',
    openTelemetry: 'idempotency.expired_leases',
    unit: '{lease}',
  },
  poisonEvents: {
    prometheus: 'idempotency_poison_events',
    openTelemetry: 'idempotency.poison_events',
    unit: '{event}',
  },
  jobs: { prometheus: 'idempotency_jobs_total', openTelemetry: 'idempotency.jobs', unit: '{job}' },
  queueJobs: { prometheus: 'idempotency_queue_jobs', openTelemetry: 'idempotency.queue.jobs', unit: '{job}' },
  queueOldestWaiting: {
    prometheus: 'idempotency_queue_oldest_waiting_seconds',
    openTelemetry: 'idempotency.queue.oldest_waiting',
    unit: 's',
  },
} as const;

/** The span attributes the library sets, beside OpenTelemetry's messaging conventions. */
export const SPAN_ATTRIBUTES = {
  scope: 'idempotency.scope',
  mode: 'idempotency.mode',
  outcome: 'idempotency.outcome',
  attempt: 'idempotency.attempt',
  messagingSystem: 'messaging.system',
  operationType: 'messaging.operation.type',
  operationName: 'messaging.operation.name',
  messageId: 'messaging.message.id',
  destination: 'messaging.destination.name',
} as const;

/**
 * How a delivery ended, as the duration histograms label it (`result`): `processed` (the handler
 * ran and its claim is done), `replayed`, `in_flight`, `failed` (the handler or its commit
 * failed), `unavailable` (the database was: answered 503), `stale` (the ordering guard found the
 * event older than its entity's version), `conflict` (a key reused with another fingerprint,
 * refused 422).
 */
export type DeliveryResult =
  'processed' | 'replayed' | 'in_flight' | 'stale' | 'conflict' | 'failed' | 'unavailable';
