import { Check, Column, Entity, Index, PrimaryColumn } from 'typeorm';
import { PROCESSED_EVENTS_TABLE } from '../idempotency.constants.js';

/** Lifecycle of a claim. Transaction mode only ever commits `done`; external mode uses all three. */
export type ProcessedEventStatus = 'in_progress' | 'done' | 'failed';

/**
 * One claimed event per (scope, key). Register it with TypeORM through `IDEMPOTENCY_ENTITIES`,
 * and create the table with `CreateProcessedEvents1764547200000` (or `synchronize` in development).
 * Constraint and index names are the migration's, so `synchronize` and `migration:generate` find
 * nothing to change on a migrated table.
 */
@Entity({ name: PROCESSED_EVENTS_TABLE })
@Check('processed_events_status_check', `status IN ('in_progress', 'done', 'failed')`)
@Index('processed_events_expiring_idx', ['leaseExpiresAt'], { where: `status = 'in_progress'` })
@Index('processed_events_retention_idx', ['completedAt'], { where: `status = 'done'` })
export class ProcessedEvent {
  /** Which handler claimed it (default `ControllerClass.method`). */
  @PrimaryColumn({ type: 'varchar', length: 255, primaryKeyConstraintName: 'processed_events_pkey' })
  scope!: string;

  /** The event's identity (Stripe `evt_...`, `X-GitHub-Delivery`). */
  @PrimaryColumn({ name: 'event_key', type: 'text', primaryKeyConstraintName: 'processed_events_pkey' })
  key!: string;

  /** Who sent it, for reporting (default: the scope). */
  @Column({ type: 'varchar', length: 255 })
  source!: string;

  @Column({ type: 'varchar', length: 16 })
  status!: ProcessedEventStatus;

  /** How many times the claim was taken (external mode re-claims count up). */
  @Column({ type: 'integer', default: 1 })
  attempts!: number;

  /** Fencing token of the current external-mode lease. */
  @Column({ name: 'lease_token', type: 'uuid', nullable: true })
  leaseToken!: string | null;

  @Column({ name: 'claimed_at', type: 'timestamptz', default: () => 'now()' })
  claimedAt!: Date;

  @Column({ name: 'lease_expires_at', type: 'timestamptz', nullable: true })
  leaseExpiresAt!: Date | null;

  @Column({ name: 'completed_at', type: 'timestamptz', nullable: true })
  completedAt!: Date | null;

  /** Short message of the last failure (external mode). */
  @Column({ name: 'last_error', type: 'text', nullable: true })
  lastError!: string | null;
}

/** Entities to add to your TypeORM configuration: `entities: [...yours, ...IDEMPOTENCY_ENTITIES]`. */
export const IDEMPOTENCY_ENTITIES = [ProcessedEvent];
