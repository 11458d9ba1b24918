import type { Logger } from '@nestjs/common';
import type { EventOrder } from '../core/event-order.js';
import type { ClaimVariant } from '../postgres/claim-rounds.js';
import { orderedClaimTypes, type OrderedClaimStatements } from '../postgres/ordered-claim.sql.js';
import type { ClaimStatement } from '../postgres/statement-executor.js';

const staleEvent = (scope: string, key: string, claim: OrderedClaim) =>
  `stale: ${scope} key ${key} has version ${claim.order.version} of entity ${claim.order.entity} ` +
  `(order scope ${claim.order.spec.scope}), ` +
  (claim.appliedVersion === null
    ? 'not newer than the version a delivery committed while this one waited'
    : `not newer than the applied version ${claim.appliedVersion}`) +
  `; ${claim.order.spec.runStale ? 'its handler ran with context.stale' : 'not applied'}`;

/**
 * One transaction-mode delivery's claim under an ordering guard (core/event-order.ts): the claim
 * sent as the ordered claim (postgres/ordered-claim.sql.ts), which checks and advances the
 * entity's version in the same statement, and what it answered. Made once per delivery and sent
 * again by each of its tries: each answer replaces the last.
 */
export class OrderedClaim implements ClaimVariant {
  /** The ordered claim of the guard's `equalVersions`. */
  readonly statement: ClaimStatement;
  /** Its parameter types, for PREPARE. */
  readonly types: readonly string[];
  /** The guard's scope, the entity and the version, after the claim's values. */
  readonly values: readonly string[];
  /** The last answer: the event is older than its entity's applied version (or as old, with `equalVersions: 'stale'`). */
  stale = false;
  /** The applied version when stale, if the claim's snapshot saw it; for the log. */
  appliedVersion: string | null = null;

  constructor(
    statements: OrderedClaimStatements,
    /** The delivery's entity and version, and its handler's guard. */
    readonly order: EventOrder,
    /** Whether `statements` are the checked ones (key checks: the claim's values end with a fingerprint). */
    checked: boolean,
  ) {
    this.types = orderedClaimTypes(checked);
    this.statement = order.spec.equalVersions === 'apply' ? statements.applyEqual : statements.staleEqual;
    this.values = [order.spec.scope, order.entity, order.version];
  }

  /** Reads what the ordered claim answered (OrderedClaimRow). */
  answered(row: Readonly<Record<string, unknown>>): void {
    this.stale = row.stale === true;
    this.appliedVersion = (row.applied_version as string | null | undefined) ?? null;
  }

  /** Whether the handler runs for this delivery: always when it is not stale, else only with `runStale`. */
  get runsHandler(): boolean {
    return !this.stale || this.order.spec.runStale;
  }

  /** Logs a stale delivery once its claim has committed, at debug: a stale event is expected, not a fault. */
  logCommitted(logger: Logger, scope: string, key: string): void {
    if (this.stale) logger.debug(staleEvent(scope, key, this));
  }
}
