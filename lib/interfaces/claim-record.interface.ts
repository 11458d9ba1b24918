/**
 * A claim's state as the operator tools show it: the stored status, with an in-progress claim
 * whose lease has run out told apart (`expired`: its worker probably died, the next delivery
 * re-claims it) from one still held (`in_progress`: a delivery is, or may be, running it).
 */
export type ClaimState = 'in_progress' | 'expired' | 'failed' | 'done';

/** What `IdempotencyClaims.list()` selects: a state, or `poison` (not done after `maxAttempts` attempts or more). */
export type ClaimListStatus = ClaimState | 'poison';

/** Filters of `IdempotencyClaims.list()`. */
export interface ClaimListOptions {
  /** Only claims in this state. @default every state */
  status?: ClaimListStatus;
  /** Only claims of this scope (`'Class.method'`, or the scope you gave). */
  scope?: string;
  /** Only claims whose last attempt was claimed at least this many ms ago (database clock). */
  olderThanMs?: number;
  /** At most this many claims, most recently claimed first (poison: most attempts first). @default 100 */
  limit?: number;
}

/** One row of the claims table, as the operator tools read it. */
export interface ClaimRecord {
  scope: string;
  key: string;
  source: string;
  status: ClaimState;
  /** Not done after `maxAttempts` attempts or more: the reporter logs it as a poison event. */
  poison: boolean;
  attempts: number;
  /** The fencing token of the lease (external mode), null when nobody holds it. */
  leaseToken: string | null;
  /** When its last attempt was claimed. */
  claimedAt: Date;
  leaseExpiresAt: Date | null;
  completedAt: Date | null;
  /** Milliseconds since `claimedAt`, on the database clock. */
  ageMs: number;
  /** Milliseconds left on a live lease; null for any other state. */
  leaseLeftMs: number | null;
  lastError: string | null;
}

/**
 * Why an operator action changed nothing:
 * - `not_found`: no claim of that scope and key (a transaction-mode delivery still running is not
 *   visible until it commits);
 * - `done`: release of a done claim: there is no lease to release (forget it instead);
 * - `failed`: release of a failed claim: it holds no lease, the next delivery claims it already;
 * - `live_lease`: forget of a claim whose lease is live: release it first;
 * - `force_required`: forget without `force: true`;
 * - `locked`: a delivery holds the row (running it in a transaction) or keeps changing it right now; try again.
 */
export type ClaimRefusalReason = 'not_found' | 'done' | 'failed' | 'live_lease' | 'force_required' | 'locked';

/** An operator action that changed nothing, and why. */
export interface ClaimRefusal {
  reason: ClaimRefusalReason;
  /** What happened and what to do, in a sentence. */
  message: string;
  /** The claim as it is, when there is one. */
  claim?: ClaimRecord;
}

/** What `IdempotencyClaims.release()` did. */
export type ReleaseClaimResult =
  | {
      released: true;
      /** The claim after the release: `failed`, no token, `lastError` saying an operator released it. */
      claim: ClaimRecord;
      /**
       * The lease had not run out: if its worker is still running, its completion is now refused
       * (`lease_lost`), and its side effect may run a second time under the next delivery.
       */
      leaseWasLive: boolean;
    }
  | { released: false; refusal: ClaimRefusal };

/** What `IdempotencyClaims.forget()` did. */
export type ForgetClaimResult =
  | {
      forgotten: true;
      /** The claim as it was before it was deleted. */
      claim: ClaimRecord;
    }
  | { forgotten: false; refusal: ClaimRefusal };
