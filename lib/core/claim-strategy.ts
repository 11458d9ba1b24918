import type { EntityManager } from 'typeorm';
import type { ClaimCheck, ClaimChecks, StoredResponse } from './claim-check.js';
import type { ClaimResult } from './claim-result.js';
import type { EventOrder } from './event-order.js';
import type { Propagation } from './propagation.js';

/**
 * What one handler's claims are made of, resolved once per handler (a decorator) or per call
 * (`IdempotencyService.run`), so a delivery allocates nothing for it.
 */
export interface ClaimSpec {
  /** Claims are unique per (scope, key). */
  readonly scope: string;
  /** Stored with the claim, for reports. */
  readonly source: string;
  /** Which strategy claims (see strategies/claim-strategies.ts). */
  readonly mode: string;
  /** External mode: this handler's lease; undefined means the module's `leaseMs`. */
  readonly leaseMs?: number;
  /** External mode: renew the lease every leaseMs/3 while the handler runs. */
  readonly heartbeat?: boolean;
  /** What a claim made while another delivery runs does (see propagation.ts). */
  readonly propagation: Propagation;
  /**
   * Key checks (claim-check.ts): set by `@IdempotentWebhook` and `@IdempotentRequest`, whose
   * claims store a fingerprint and can store a response; undefined for `@Idempotent` and
   * `IdempotencyService.run()`, whose claims are as before.
   */
  readonly checks?: ClaimChecks;
}

/**
 * SQL sent on one connection, in the shape libraries that write inside a caller's transaction
 * take (pg-boss's `db` option): pg's result, whose `rows` such a library reads.
 */
export interface SqlExecutor {
  executeSql(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
}

/**
 * SQL on the claim transaction's own connection: sent now (`executeSql`), or with the COMMIT, in
 * the same round trip (`beforeCommit`).
 */
export interface TransactionExecutor extends SqlExecutor {
  /**
   * Sends `text` (a statement that may stand in a WITH: a SELECT, or an INSERT, UPDATE or DELETE
   * with RETURNING) together with the COMMIT, its values inlined as literals: it costs no round
   * trip of its own. With `mustWrite`, a statement that returns no row fails the COMMIT with that
   * message (a data error, so the delivery fails and nothing is written).
   */
  beforeCommit(text: string, values: readonly unknown[], mustWrite?: string): void;
}

/** What a strategy hands the work it runs under a claim. */
export interface ClaimHandle {
  /** Transaction mode: the manager of the claim's transaction. External mode has none. */
  readonly manager?: EntityManager;
  /**
   * Transaction mode: SQL on the claim transaction's own connection (what a job enqueued with
   * the delivery is written through), refused once the transaction is over.
   */
  readonly executor?: TransactionExecutor;
  /** External mode: the claim's fencing token. */
  readonly leaseToken?: string;
  /** External mode: 1 for the first claim, then +1 for each re-claim. */
  readonly attempt?: number;
  /** External mode: token-checked renewal; false once the lease was taken over. */
  readonly extendLease?: (ms?: number) => Promise<boolean>;
  /** Aborts when the claim is no longer this delivery's (external mode: lease lost or run out). */
  readonly signal: AbortSignal;
  /**
   * True when the ordering guard found the event older than its entity's applied version and the
   * handler runs all the same (`runStale`). Undefined for a handle without the guard.
   */
  readonly stale?: boolean;
  /** Runs `fn` once the claim is recorded done (the COMMIT, or the fenced completion), never otherwise. */
  afterCommit(fn: () => unknown): void;
  /**
   * Key checks: stores what the handler answered with the claim, written by the COMMIT
   * (transaction mode) or the fenced completion (external mode), never apart from it.
   */
  recordResponse?(response: StoredResponse): void;
}

/** One claim for a strategy to make: ClaimStrategy.run's one parameter. */
export interface ClaimRun<T> {
  /** The handler's claims (scope, source, mode, ...). */
  readonly spec: ClaimSpec;
  /** The event's key. */
  readonly key: string;
  /** Runs under the claim, when it is this delivery's. */
  readonly work: (handle: ClaimHandle) => Promise<T>;
  /**
   * The handle of the delivery this claim is made in, when the spec's propagation joins it: the
   * claim is made inside that delivery's transaction (only transaction mode is asked to).
   */
  readonly enclosing?: ClaimHandle;
  /** Key checks: the delivery's fingerprint and what a conflict gets (with spec.checks). */
  readonly check?: ClaimCheck;
  /**
   * The ordering guard: the delivery's entity and version, for handlers with `order` (transaction
   * mode only, refused for external mode when the decorator is applied).
   */
  readonly order?: EventOrder;
}

/**
 * One way of making a delivery's effect happen once. A strategy claims (scope, key), runs `work`
 * when the claim is its own, records the outcome and counts it. It resolves `processed`,
 * `replayed`, `in_flight`, `conflict` (key checks) or `stale` (the ordering guard); it rejects
 * with IdempotencyUnavailableError when the database failed, TransactionAbortedError, or the
 * work's own error.
 */
export interface ClaimStrategy {
  run<T>(claim: ClaimRun<T>): Promise<ClaimResult<T>>;
}
