import { Inject, Injectable } from '@nestjs/common';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import type { IdempotencyConfig } from '../interfaces/index.js';

/** Durations kept per scope: the latest ones, so the estimate follows a handler that changes. */
const SAMPLES = 32;
/** Below this many, a scope's estimate is not trusted yet and the configured Retry-After is used. */
const MIN_SAMPLES = 5;
/** The estimate is this quantile of the recent durations: most deliveries finish within it. */
const QUANTILE = 0.95;
/** At most this many scopes are followed; beyond it the least recent one is dropped. */
const MAX_SCOPES = 1_000;

/** One scope's recent durations, in a ring. */
interface Ring {
  readonly ms: Float64Array;
  count: number;
  next: number;
}

/**
 * The `Retry-After` told to a duplicate that finds its event in flight: how long the delivery
 * holding it probably still takes. A fixed value is wrong both ways: 30 s for a handler that takes
 * 10 ms makes senders (and a queue backoff built on `retryAfterSeconds`) wait 30 s for work long
 * done, while 1 s for a handler that takes minutes makes them hammer. So each process keeps the
 * durations of its recent deliveries per scope, and the answer is their 95th percentile minus the
 * time the holder has already spent, in whole seconds, at least 1 and at most `upperSeconds` (the
 * lease's remaining time in external mode, `retryAfterSeconds` in transaction mode). Until a scope
 * has a few deliveries behind it the answer is `upperSeconds` capped at `retryAfterSeconds`, as
 * before this estimate existed.
 *
 * Recording costs a map lookup and one store into a preallocated ring per delivery; the
 * percentile is computed only when a duplicate is answered.
 */
@Injectable()
export class RetryAfterEstimator {
  private readonly rings = new Map<string, Ring>();

  constructor(@Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig) {}

  /** Records that a delivery of `scope` took `ms` from its claim to its completion. */
  record(scope: string, ms: number): void {
    let ring = this.rings.get(scope);
    if (!ring) {
      if (this.rings.size >= MAX_SCOPES) this.rings.delete(this.rings.keys().next().value!);
      ring = { ms: new Float64Array(SAMPLES), count: 0, next: 0 };
      this.rings.set(scope, ring);
    }
    ring.ms[ring.next] = ms;
    ring.next = (ring.next + 1) % SAMPLES;
    if (ring.count < SAMPLES) ring.count++;
  }

  /**
   * Seconds a duplicate should wait for the delivery of `scope` that has held its event for
   * `heldMs`, between 1 and `upperSeconds`.
   */
  seconds(scope: string, heldMs: number, upperSeconds: number): number {
    const upper = Math.max(1, Math.floor(upperSeconds));
    const ring = this.rings.get(scope);
    if (!ring || ring.count < MIN_SAMPLES) return Math.min(upper, this.config.retryAfterSeconds);
    const sorted = ring.ms.slice(0, ring.count).sort();
    const typical = sorted[Math.min(ring.count - 1, Math.ceil(QUANTILE * ring.count) - 1)];
    return Math.min(upper, Math.max(1, Math.ceil((typical - heldMs) / 1000)));
  }
}
