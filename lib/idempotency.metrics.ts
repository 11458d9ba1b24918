import { Inject, Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { IDEMPOTENCY_CONFIG } from './idempotency.constants.js';
import { prometheusMetrics, type PromCounter, type PromGauge } from './core/prometheus-metrics.js';
import { hookFailed } from './idempotency.messages.js';
import { publishOutcome } from './observability/outcome-channels.js';
import type { ClaimOutcome, IdempotencyConfig } from './interfaces/index.js';

/**
 * Counts every outcome. Always keeps in-process totals (`snapshot()`); also feeds prom-client's
 * `idempotency_claims_total{scope,outcome}`, `idempotency_expired_leases` and
 * `idempotency_poison_events` when prom-client is installed, the `onOutcome` hook for anything
 * else, and the diagnostics channels (IDEMPOTENCY_CHANNELS).
 */
@Injectable()
export class IdempotencyMetrics implements OnModuleInit {
  private readonly logger = new Logger('IdempotencyMetrics');
  private readonly totals = new Map<string, Map<ClaimOutcome, number>>();
  private expired = 0;
  private poison = 0;
  private counter?: PromCounter;
  private gauge?: PromGauge;
  private poisonGauge?: PromGauge;
  /**
   * Told every counted outcome, in the delivery's context: set by DeliveryTelemetry when it
   * traces, so the delivery's span carries the outcome (lib/observability/).
   */
  outcomeListener?: (outcome: ClaimOutcome, scope: string, key: string) => void;

  constructor(@Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig) {}

  async onModuleInit(): Promise<void> {
    const prom = await prometheusMetrics(this.config.prometheus);
    if (!prom) return; // Without prom-client only the hook and snapshot() report.
    this.counter = prom.counter('idempotency_claims_total', 'Webhook deliveries by idempotency outcome', [
      'scope',
      'outcome',
    ]);
    this.gauge = prom.gauge(
      'idempotency_expired_leases',
      'In-progress claims whose lease expired (their worker probably died), at the last report',
    );
    // Observability (lib/observability/): the reporter's poison events, for the alert rules.
    this.poisonGauge = prom.gauge(
      'idempotency_poison_events',
      'Claims not done after maxAttempts attempts (at most 100), at the last report',
    );
  }

  /** Counts one outcome. */
  count(outcome: ClaimOutcome, scope: string, key: string): void {
    const byOutcome = this.totals.get(scope) ?? new Map<ClaimOutcome, number>();
    byOutcome.set(outcome, (byOutcome.get(outcome) ?? 0) + 1);
    this.totals.set(scope, byOutcome);
    this.counter?.inc({ scope, outcome });
    // Observability hooks (lib/observability/): diagnostics channels, and the delivery's span.
    publishOutcome(outcome, scope, key);
    this.outcomeListener?.(outcome, scope, key);
    if (this.config.onOutcome) {
      try {
        this.config.onOutcome({ outcome, scope, key });
      } catch (error) {
        this.logger.error(hookFailed('onOutcome', error));
      }
    }
  }

  /** Records how many expired leases the last report found. */
  setExpiredLeases(count: number): void {
    this.expired = count;
    this.gauge?.set(count);
  }

  /** Records how many poison events the last report found (it lists at most 100). */
  setPoisonEvents(count: number): void {
    this.poison = count;
    this.poisonGauge?.set(count);
  }

  /**
   * In-process totals: `{ 'Scope.method': { claimed: 3, replayed: 1 } }`, and the expired-lease
   * and poison-event gauges.
   */
  snapshot(): {
    claims: Record<string, Partial<Record<ClaimOutcome, number>>>;
    expiredLeases: number;
    poisonEvents: number;
  } {
    const claims: Record<string, Partial<Record<ClaimOutcome, number>>> = {};
    for (const [scope, byOutcome] of this.totals) claims[scope] = Object.fromEntries(byOutcome);
    return { claims, expiredLeases: this.expired, poisonEvents: this.poison };
  }
}
