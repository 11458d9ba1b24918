import { Inject, Injectable, Logger } from '@nestjs/common';
import type { ConflictState } from '../core/claim-check.js';
import { UnstableKeys } from '../core/unstable-keys.js';
import { IDEMPOTENCY_CONFIG, MAX_REMEMBERED_FINGERPRINTS } from '../idempotency.constants.js';
import { IdempotencyMetrics } from '../idempotency.metrics.js';
import type { IdempotencyConfig } from '../interfaces/index.js';

const STATE_WORDS: Record<ConflictState, string> = {
  done: 'done',
  failed: 'failed',
  in_flight: 'in flight',
};

/** Logged once per handler: a key claimed with another fingerprint. */
export const keyConflictLog = (scope: string, key: string, state: ConflictState, refused: boolean) =>
  `${scope} received key ${key} with another fingerprint than its claim (${STATE_WORDS[state]}): ` +
  `the key names something other than one event (keyed on an object id, one charge's second ` +
  `event is swallowed as a copy of its first). ${refused ? 'Refused 422' : 'Answered as that claim'}; ` +
  `counted as key_conflict. Key on the event's own id (stripeEventKey, githubDeliveryKey, ...)`;

/** Logged once per handler: one fingerprint under two keys. */
export const keyUnstableLog = (scope: string, key: string, earlier: string) =>
  `${scope} received the same event under key ${key} and, earlier, under ${earlier}: its key ` +
  `changes between copies (a timestamp or a UUID taken at arrival), so every retry runs it again. ` +
  `Counted as key_unstable. Key on the event's own id (stripeEventKey, githubDeliveryKey, ...)`;

/**
 * What the key checks find about a handler's keys, logged once per handler and counted
 * (`key_conflict`, `key_unstable`) with every occurrence: a key reused for another event, and an
 * event arriving under a second key (detectUnstableKeys).
 */
@Injectable()
export class KeyFindings {
  private readonly logger = new Logger('IdempotencyModule');
  private readonly warnedConflict = new Set<string>();
  private readonly warnedUnstable = new Set<string>();
  private readonly unstable?: UnstableKeys;

  constructor(
    private readonly metrics: IdempotencyMetrics,
    @Inject(IDEMPOTENCY_CONFIG) config: IdempotencyConfig,
  ) {
    if (config.detectUnstableKeys) {
      this.unstable = new UnstableKeys(config.unstableKeyWindowMs, MAX_REMEMBERED_FINGERPRINTS);
    }
  }

  /** A delivery's fingerprint differed from its claim's; `refused` when it was answered 422. */
  conflict(scope: string, key: string, state: ConflictState, refused: boolean): void {
    this.metrics.count('key_conflict', scope, key);
    if (this.warnedConflict.has(scope)) return;
    this.warnedConflict.add(scope);
    this.logger.warn(keyConflictLog(scope, key, state, refused));
  }

  /** Compares a webhook delivery's fingerprint with the keys it arrived under lately (if on). */
  observe(scope: string, key: string, fingerprint: string | null): void {
    if (this.unstable === undefined || fingerprint === null) return;
    const earlier = this.unstable.see(scope, fingerprint, key);
    if (earlier === undefined) return;
    this.metrics.count('key_unstable', scope, key);
    if (this.warnedUnstable.has(scope)) return;
    this.warnedUnstable.add(scope);
    this.logger.warn(keyUnstableLog(scope, key, earlier));
  }
}
