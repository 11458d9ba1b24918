import { claimNotFound, claimUnsettled } from '../idempotency.messages.js';
import type {
  ClaimListOptions,
  ClaimListStatus,
  ClaimRecord,
  ClaimRefusal,
  ForgetClaimResult,
  ReleaseClaimResult,
} from '../interfaces/index.js';
import type { ClaimTable } from '../postgres/claim-table.js';
import { operatorStatements, type OperatorStatements } from '../postgres/operator.sql.js';
import { errorCode, LOCK_NOT_AVAILABLE } from '../postgres/pg-errors.js';

/** `last_error` of a claim an operator released. */
export const releasedByOperator = () => 'released by an operator; the next delivery claims it again';

const releaseOfDone = (scope: string, key: string) =>
  `${scope} key ${key} is done: there is no lease to release. To process the event again, forget it (force: true, or claims forget --force)`;

const releaseOfFailed = (scope: string, key: string) =>
  `${scope} key ${key} holds no lease: its last attempt failed, and its next delivery claims it already`;

const forgetOfLiveLease = (scope: string, key: string, leaseLeftMs: number | null) =>
  `${scope} key ${key} is being processed: its lease has ${
    leaseLeftMs === null ? 'no expiry' : `${Math.ceil(leaseLeftMs / 1000)} s left`
  }. If its worker is stuck or dead, release it first`;

const forgetNeedsForce = (scope: string, key: string, status: string) =>
  `forgetting ${scope} key ${key} (${status}) makes its next delivery run the handler again: pass force: true (claims forget --force) to confirm`;

const claimLocked = (scope: string, key: string) =>
  `${scope} key ${key} is held by a delivery running it in a transaction right now; try again once it finishes`;

const badListOption = (option: string, value: unknown, expected: string) =>
  `IdempotencyClaims.list option ${option} must be ${expected}, got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

/** Sends one statement: a pg Pool's or Client's `query`. */
export type OperatorQuery = (text: string, values: unknown[]) => Promise<{ rows: Record<string, any>[] }>;

/** How the operator tools reach the claims table. */
export interface ClaimsOperatorSettings {
  table: ClaimTable;
  /** The module's `maxAttempts`: claims with this many attempts that are not done are poison. */
  maxAttempts: number;
  /** How long an action waits for a delivery holding the row before it answers `locked`, in ms. */
  lockWaitMs: number;
}

/** Claims listed when no limit is given. */
export const DEFAULT_LIST_LIMIT = 100;

const LIST_STATUSES: readonly ClaimListStatus[] = ['in_progress', 'expired', 'failed', 'poison', 'done'];

/**
 * Rounds an action takes when the claim changes between its statement and the read that explains
 * it (a lease that expires meanwhile, a delivery that claims): a few settle it.
 */
const MAX_ACTION_ROUNDS = 3;

/**
 * What the operator tools do to the claims table, decided once for both `IdempotencyClaims` (in
 * the app, on its DataSource's pool) and the `claims` CLI (on a pg client of its own): no Nest,
 * no logging, no metrics, which the service adds. Every refusal is a value, never a throw; only
 * database failures throw.
 */
export class ClaimsOperator {
  private readonly statements: OperatorStatements;
  private readonly lockTimeout: string;

  constructor(
    private readonly query: OperatorQuery,
    private readonly settings: ClaimsOperatorSettings,
  ) {
    this.statements = operatorStatements(settings.table);
    // 0 would mean "wait forever": 1 ms is the shortest real bound.
    this.lockTimeout = `${Math.max(1, Math.ceil(settings.lockWaitMs))}ms`;
  }

  /** Claims in a state, of a scope, at least so old; see ClaimListOptions. */
  async list(options: ClaimListOptions = {}): Promise<ClaimRecord[]> {
    const { status, scope, olderThanMs, limit = DEFAULT_LIST_LIMIT } = options;
    if (status !== undefined && !LIST_STATUSES.includes(status))
      throw new TypeError(badListOption('status', status, `one of ${LIST_STATUSES.join(', ')}`));
    if (scope !== undefined && typeof scope !== 'string')
      throw new TypeError(badListOption('scope', scope, 'a string'));
    if (olderThanMs !== undefined && !(typeof olderThanMs === 'number' && olderThanMs >= 0))
      throw new TypeError(badListOption('olderThanMs', olderThanMs, 'a number of ms, zero or more'));
    if (!Number.isInteger(limit) || limit < 1)
      throw new TypeError(badListOption('limit', limit, 'a whole number, 1 or more'));
    const { rows } = await this.query(this.statements.list[status ?? 'all'], [
      this.settings.maxAttempts,
      scope ?? null,
      olderThanMs ?? null,
      limit,
    ]);
    return rows.map(toRecord);
  }

  /** The claim of `key` under `scope`, or undefined. */
  async show(scope: string, key: string): Promise<ClaimRecord | undefined> {
    const { rows } = await this.query(this.statements.show, [scope, key, this.settings.maxAttempts]);
    return rows[0] ? toRecord(rows[0]) : undefined;
  }

  /**
   * Takes an in-progress claim, live or expired, away from whoever holds it: it becomes `failed`
   * with no token, so the next delivery claims it at once (attempt + 1), and a holder still
   * running finds its lease lost when it finishes. Refuses a done claim, a failed one (it holds
   * no lease: the next delivery claims it already) and an unknown one.
   */
  async release(scope: string, key: string): Promise<ReleaseClaimResult> {
    for (let round = 1; ; round++) {
      const rows = await this.locking(() =>
        this.query(this.statements.release, [
          scope,
          key,
          this.settings.maxAttempts,
          releasedByOperator(),
          this.lockTimeout,
        ]),
      );
      if (rows === 'locked') return { released: false, refusal: await this.lockedRefusal(scope, key) };
      if (rows[0]) return { released: true, claim: toRecord(rows[0]), leaseWasLive: rows[0].lease_live };
      const claim = await this.show(scope, key);
      // In progress after all: claimed by a delivery since the update's snapshot. Release that one.
      const inProgress = claim?.status === 'in_progress' || claim?.status === 'expired';
      if (!inProgress) return { released: false, refusal: releaseRefusal(scope, key, claim) };
      if (round >= MAX_ACTION_ROUNDS) {
        return { released: false, refusal: { reason: 'locked', message: claimUnsettled(scope, key), claim } };
      }
    }
  }

  /**
   * Deletes a claim no live lease holds (done, failed or expired), so the event's next delivery
   * is a first delivery and runs the handler again. Refuses without `force: true`, refuses a live
   * lease even with it (release it first), and an unknown claim.
   */
  async forget(scope: string, key: string, options: { force?: boolean } = {}): Promise<ForgetClaimResult> {
    for (let round = 1; ; round++) {
      const claim = await this.show(scope, key);
      if (!claim)
        return { forgotten: false, refusal: { reason: 'not_found', message: claimNotFound(scope, key) } };
      if (claim.status === 'in_progress') {
        return {
          forgotten: false,
          refusal: { reason: 'live_lease', message: forgetOfLiveLease(scope, key, claim.leaseLeftMs), claim },
        };
      }
      if (options.force !== true) {
        return {
          forgotten: false,
          refusal: { reason: 'force_required', message: forgetNeedsForce(scope, key, claim.status), claim },
        };
      }
      const rows = await this.locking(() =>
        this.query(this.statements.forget, [scope, key, this.settings.maxAttempts, this.lockTimeout]),
      );
      if (rows === 'locked') return { forgotten: false, refusal: await this.lockedRefusal(scope, key) };
      if (rows[0]) return { forgotten: true, claim: toRecord(rows[0]) };
      // Claimed (or deleted) between the read and the delete: read again and decide on that.
      if (round >= MAX_ACTION_ROUNDS) {
        const now = await this.show(scope, key);
        return {
          forgotten: false,
          refusal: now
            ? { reason: 'live_lease', message: forgetOfLiveLease(scope, key, now.leaseLeftMs), claim: now }
            : { reason: 'not_found', message: claimNotFound(scope, key) },
        };
      }
    }
  }

  /** Runs a statement that may wait on a delivery's row lock; its lock_timeout running out is 'locked'. */
  private async locking(send: () => Promise<{ rows: Record<string, any>[] }>) {
    try {
      return (await send()).rows;
    } catch (error) {
      if (errorCode(error) === LOCK_NOT_AVAILABLE) return 'locked' as const;
      throw error;
    }
  }

  private async lockedRefusal(scope: string, key: string): Promise<ClaimRefusal> {
    return { reason: 'locked', message: claimLocked(scope, key), claim: await this.show(scope, key) };
  }
}

/** Why release changed nothing, from the claim as it is now. */
function releaseRefusal(scope: string, key: string, claim: ClaimRecord | undefined): ClaimRefusal {
  if (!claim) return { reason: 'not_found', message: claimNotFound(scope, key) };
  if (claim.status === 'done') return { reason: 'done', message: releaseOfDone(scope, key), claim };
  return { reason: 'failed', message: releaseOfFailed(scope, key), claim };
}

const dateOrNull = (value: unknown) =>
  value === null || value === undefined ? null : new Date(value as string);
const numberOrNull = (value: unknown) => (value === null || value === undefined ? null : Number(value));

/** A row of the operator statements as a ClaimRecord. */
function toRecord(row: Record<string, any>): ClaimRecord {
  return {
    scope: row.scope,
    key: row.event_key,
    source: row.source,
    status: row.state,
    poison: row.poison === true,
    attempts: Number(row.attempts),
    leaseToken: row.lease_token ?? null,
    claimedAt: new Date(row.claimed_at),
    leaseExpiresAt: dateOrNull(row.lease_expires_at),
    completedAt: dateOrNull(row.completed_at),
    ageMs: Number(row.age_ms),
    leaseLeftMs: numberOrNull(row.lease_left_ms),
    lastError: row.last_error ?? null,
  };
}
