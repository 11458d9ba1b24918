import type { DeadLetteredJob } from './handoff.interface.js';

/** An external-mode claim whose lease ran out while still in progress: its worker probably died. */
export interface ExpiredLease {
  scope: string;
  key: string;
  source: string;
  attempts: number;
  claimedAt: Date;
  leaseExpiresAt: Date;
  /** Milliseconds between the lease's expiry and the report (database clock). */
  expiredForMs: number;
}

/** A claim that has needed `maxAttempts` attempts or more and is still not done. */
export interface PoisonEvent {
  scope: string;
  key: string;
  source: string;
  status: 'in_progress' | 'failed';
  attempts: number;
  lastError: string | null;
}

/**
 * A claim that never finished (a failed attempt, or a lease whose worker died) and was last
 * claimed more than `retentionDays` ago, removed by retention: its event will not be retried.
 */
export interface AbandonedClaim {
  scope: string;
  key: string;
  status: 'in_progress' | 'failed';
  attempts: number;
}

/** Options of `ExpiredLeaseReporter.run()`. */
export interface ReporterRunOptions {
  /**
   * Report even when another replica (or an earlier run) already took this tick, so a run by
   * hand (an admin endpoint, a script) always answers with what it found. Its retention may then
   * run beside that replica's, which is safe: each row is deleted, and counted, once.
   * @default false
   */
  force?: boolean;
}

/**
 * What one reporter run found and did. `skipped` when another replica already reported this tick
 * (never with `force: true`).
 */
export interface ReporterRunResult {
  skipped: boolean;
  expired: ExpiredLease[];
  expiredCount: number;
  poison: PoisonEvent[];
  /** Done rows retention deleted. */
  deleted: number;
  /** Versions of the ordering guard retention deleted (last applied more than `retentionDays` ago). */
  deletedVersions: number;
  /** Claims that never finished, removed by retention (each also logged as a warning). */
  abandoned: AbandonedClaim[];
  /** Handoff jobs waiting in dead-letter queues (each also logged as an error); [] without `handoff`. */
  deadLettered: DeadLetteredJob[];
}
