/**
 * The `nest-idempotent-webhooks/observability` entry: what a monitoring set-up imports. The
 * Prometheus counters of claims (IdempotencyMetrics) and of the handoff's jobs (HandoffMetrics),
 * the @nestjs/terminus health indicator, and the `node:diagnostics_channel` names the library
 * publishes outcomes on. The module's `telemetry` option (TelemetryOptions) is typed on the root.
 */
export { IdempotencyMetrics } from '../idempotency.metrics.js';
export { HandoffMetrics } from '../transports/queue/handoff-metrics.js';
export {
  IdempotencyHealthIndicator,
  type IdempotencyHealthDetails,
  type IdempotencyHealthOptions,
  type IdempotencyHealthResult,
  type QueueHealth,
} from '../health/idempotency-health.indicator.js';
export { IDEMPOTENCY_CHANNELS, type OutcomeChannelMessage } from './outcome-channels.js';
export type { JobOutcome } from '../interfaces/index.js';
