import type { EntityManager } from 'typeorm';
import type { StoredResponse } from './claim-check.js';
import type { ClaimHandle, ClaimSpec, TransactionExecutor } from './claim-strategy.js';

/** The delivery an idempotent handler runs for; one per claim, whatever the transport. */
export interface IdempotentDelivery {
  /** The event's key. */
  readonly key: string;
  /** The claim's scope. */
  readonly scope: string;
  /** Stored with the claim, for reports. */
  readonly source: string;
  /** `'transaction'` or `'external'`. */
  readonly mode: string;
  /**
   * Transaction mode: the EntityManager of the claim's transaction; what it writes commits with
   * the claim or not at all. External mode has no claim transaction, and this throws: a write
   * there would be neither atomic with anything nor fenced, so make it through your own
   * repository and keep it idempotent on its own (see docs/modes.md, "External mode").
   */
  readonly manager: EntityManager;
  /** Transaction mode: SQL on the claim transaction's own connection, or sent with its COMMIT. */
  readonly executor?: TransactionExecutor;
  /** External mode: the claim's fencing token. */
  readonly leaseToken?: string;
  /** External mode: 1 for the first claim, then +1 for each re-claim. */
  readonly attempt?: number;
  /** External mode: token-checked renewal; resolves false once the lease was taken over. */
  readonly extendLease?: (ms?: number) => Promise<boolean>;
  /**
   * Aborts when this delivery no longer holds its claim: in external mode, when the lease was
   * taken over by another worker or ran out (a long call should stop: another worker may run the
   * event now). Pass it to `fetch()` and other abortable work. Never aborts in transaction mode.
   */
  readonly signal: AbortSignal;
  /**
   * True when the handler's ordering guard found this event older than the version its entity has
   * (the handler runs for it only with `runStale`): apply nothing that the newer event already set.
   * False otherwise, and always without the guard.
   */
  readonly stale: boolean;
  /**
   * Runs `fn` once the claim is recorded done: after the COMMIT (transaction mode; for a claim
   * that joined an enclosing delivery, after that delivery's COMMIT) or after the fenced
   * completion (external mode); never when the delivery fails or rolls back. In transaction mode
   * it also goes with the transaction level it is registered in: a claim joined in a savepoint, or
   * a transaction the handler opened on the claim's manager (`manager.transaction()`, nestjs-cls's
   * `Propagation.Nested`, `queryRunner.startTransaction()`), which drops it when rolled back, even
   * if the handler catches the error. `SAVEPOINT`/`ROLLBACK TO` sent by hand through
   * `manager.query()` are not followed. For cache busts and notifications that must not fire for
   * work that did not happen. Callbacks run in order before the answer is sent; an error in one is
   * logged and changes nothing.
   */
  afterCommit(fn: () => unknown): void;
}

/** Thrown by `manager` in external mode. */
export function noClaimTransaction(scope: string): string {
  return (
    `${scope} runs in external mode, which holds no claim transaction: there is no manager whose ` +
    `writes commit with the claim. Write through your own repository or DataSource (autocommitted, ` +
    `not fenced: keep such writes idempotent on their own), or use transaction mode for database work.`
  );
}

/** An IdempotentDelivery over a strategy's handle: what the handler and IdempotencyContext see. */
export class ClaimDelivery implements IdempotentDelivery {
  readonly scope: string;
  readonly source: string;
  readonly mode: string;

  constructor(
    spec: ClaimSpec,
    readonly key: string,
    /** The strategy's handle; a claim made inside this delivery joins it (see Propagation). */
    readonly handle: ClaimHandle,
  ) {
    this.scope = spec.scope;
    this.source = spec.source;
    this.mode = spec.mode;
  }

  get manager(): EntityManager {
    const manager = this.handle.manager;
    if (!manager) throw new Error(noClaimTransaction(this.scope));
    return manager;
  }

  get executor(): TransactionExecutor | undefined {
    return this.handle.executor;
  }

  get leaseToken(): string | undefined {
    return this.handle.leaseToken;
  }

  get attempt(): number | undefined {
    return this.handle.attempt;
  }

  get extendLease(): ((ms?: number) => Promise<boolean>) | undefined {
    return this.handle.extendLease;
  }

  get signal(): AbortSignal {
    return this.handle.signal;
  }

  get stale(): boolean {
    return this.handle.stale === true;
  }

  afterCommit(fn: () => unknown): void {
    if (typeof fn !== 'function') throw new TypeError('afterCommit() takes a function');
    this.handle.afterCommit(fn);
  }

  /** Key checks: stores the handler's response with the claim (see ClaimHandle.recordResponse). */
  recordResponse(response: StoredResponse): void {
    this.handle.recordResponse?.(response);
  }
}
