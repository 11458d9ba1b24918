import type { PoolClient } from 'pg';
import type { QueryRunner } from 'typeorm';
import { runAfterCommit } from '../core/after-commit.js';
import type { ClaimCheck, StoredResponse } from '../core/claim-check.js';
import type { ClaimHandle, TransactionExecutor } from '../core/claim-strategy.js';
import { ClaimRounds, type ClaimValues } from './claim-rounds.js';
import type { ClaimFound } from './claim-row.reader.js';
import {
  ClaimTakenError,
  CommitBatch,
  CommitRolledBackError,
  DeferredStatementMissError,
} from './commit-batch.js';
import { isDataError, isRetryable } from './pg-errors.js';
import { sendQuery } from './pg-promises.js';
import { transactionDepth } from './typeorm-internals.js';

/**
 * How a COMMIT ended, the one value the strategy acts on: committed; nothing written and the whole
 * claim may run again (`retry`: a serialization failure, or a statement sent with it that missed
 * its prepared state); `rolled_back` (a statement of the transaction had failed and the handler
 * went on, so PostgreSQL turned the COMMIT into a ROLLBACK); `refused` (the data was refused at
 * COMMIT: a deferred constraint, a job the COMMIT could not write); `unknown` (the answer was
 * lost: it may have committed). In every case but `committed` the transaction is over.
 */
export type CommitOutcome =
  | { readonly kind: 'committed' }
  | { readonly kind: 'retry' | 'rolled_back' | 'refused' | 'unknown'; readonly error: unknown };

const COMMITTED: CommitOutcome = { kind: 'committed' };

/**
 * A claim made inside an enclosing delivery's transaction (propagation `required`): a savepoint,
 * and how many statements and after-commit callbacks the transaction had collected before it, so
 * that rolling back to it also forgets what the nested delivery left to send with the COMMIT.
 */
export interface Savepoint {
  readonly name: string;
  readonly deferred: number;
  readonly afterCommit: number;
}

/**
 * One delivery's claim transaction, on a QueryRunner's own pg connection, with the round trips
 * and layers of the hand-written `BEGIN`/claim/`COMMIT`: the transaction is begun and claimed in
 * one query, then handed to TypeORM, so the handler's EntityManager sees an ordinary transaction
 * (its `manager.transaction()` nests as a savepoint, and what is sent with the COMMIT or run after
 * it goes with that savepoint: followHandlerLevel). TypeORM subscribers still hear of every
 * start, commit and rollback: when the DataSource has any, those go through the runner. Claims
 * made inside the delivery (propagation `required`) join it as savepoints (claimAt). Its parts, a
 * file each: the connection and TypeORM's runner (TransactionSession), the claim's rounds
 * (ClaimRounds) and what its rows mean (claim-row.reader.ts), the statements sent with the COMMIT
 * (CommitBatch), what each session has prepared (prepared-session.ts); here, the COMMIT and what
 * goes with the transaction's levels.
 */
export class ClaimTransaction extends ClaimRounds implements TransactionExecutor, ClaimHandle {
  /** Statements to send with the COMMIT; undefined until beforeCommit() is called. */
  private batch?: CommitBatch;
  /** Callbacks to run once the COMMIT has succeeded; undefined until afterCommit() is called. */
  private committed?: (() => unknown)[];
  /**
   * The levels the handler opened on the runner, outermost first (see followHandlerLevel): two
   * numbers each, the lengths of `batch` and `committed` when it started. Undefined until the
   * handler opens one: a delivery that never does pays nothing.
   */
  private handlerLevels?: number[];
  /** The source of `signal`, made on first use. */
  private signals?: AbortController;
  /** Savepoints taken so far, for their names. */
  private savepoints = 0;
  /**
   * Set by the ordering guard (strategies/event-ordering.ts) when the event is older than its
   * entity's applied version and the handler runs all the same (`runStale`): `context.stale`.
   */
  stale = false;

  /** SQL on this transaction's connection: the transaction itself. */
  get executor(): TransactionExecutor {
    return this;
  }

  /**
   * Never aborts: nothing takes a claim away from an open transaction. Made when first asked for
   * (one per delivery, not shared, so listeners a handler leaves on it go with the delivery).
   */
  get signal(): AbortSignal {
    return (this.signals ??= new AbortController()).signal;
  }

  /** True when a callback waits for the COMMIT (runAfterCommit has work). */
  get hasAfterCommit(): boolean {
    return this.committed !== undefined && this.committed.length > 0;
  }

  /**
   * A savepoint for a claim made while this delivery runs (no round trip: it is sent with the
   * claim), marking what the transaction has collected so far.
   */
  savepoint(): Savepoint {
    this.openClient();
    return {
      name: `idempotency_claim_${++this.savepoints}`,
      deferred: this.batch?.length ?? 0,
      afterCommit: this.committed?.length ?? 0,
    };
  }

  /**
   * Claims (scope, key, source) inside this transaction, after `savepoint`, for a claim made while
   * this delivery runs: it commits with this transaction or not at all. On an error (a duplicate's
   * lock_timeout among them) roll back to the savepoint.
   */
  claimAt(savepoint: Savepoint, values: ClaimValues, check?: ClaimCheck): Promise<ClaimFound> {
    let client: PoolClient;
    try {
      client = this.openClient();
    } catch (error) {
      return Promise.reject(error);
    }
    const head = `SAVEPOINT ${savepoint.name}`;
    return this.claimAfter(client, head, `ROLLBACK TO SAVEPOINT ${savepoint.name}`, values, check);
  }

  /**
   * Follows a transaction level the handler opened on this transaction's runner, told of TypeORM's
   * transaction events on `runner` (OutsideWriteSubscriber hears them; the claim's own BEGIN and
   * COMMIT send none unless the DataSource has subscribers, and those are at depth 0): the
   * runner's startTransaction() inside the claim's transaction (`manager.transaction()`, nestjs-cls's
   * Propagation.Nested, or by hand) takes `SAVEPOINT typeorm_<n>`, and what is collected inside
   * goes with it. `start` marks what the transaction has collected so far; `rollback` (ROLLBACK TO
   * the savepoint) forgets the statements to send with the COMMIT and the after-commit callbacks
   * collected since, as rollbackTo() does for a claim's savepoint; `commit` (RELEASE) leaves them
   * to the enclosing level's fate. The level is told by the runner's depth, so a level whose end
   * went unheard (a RELEASE that failed, then rolled back to) is settled by the next event. Levels
   * opened on any other runner are not this transaction's; SAVEPOINT and ROLLBACK TO sent by hand
   * (manager.query()) are not seen.
   */
  followHandlerLevel(runner: QueryRunner, event: 'start' | 'commit' | 'rollback'): void {
    if (!this.ownsRunner(runner)) return;
    // start: the depth before the level counts; commit and rollback: after it is uncounted. At 0,
    // the claim's own transaction is starting or over.
    const depth = transactionDepth(runner);
    if (!(depth >= 1)) return;
    const at = 2 * (depth - 1);
    if (event === 'start') {
      const deferred = this.batch?.length ?? 0;
      const committed = this.committed?.length ?? 0;
      const levels = (this.handlerLevels ??= []);
      // Levels the runner counts that were not heard starting: marked here, the nearest knowable.
      while (levels.length < at) levels.push(deferred, committed);
      levels.length = at;
      levels.push(deferred, committed);
      return;
    }
    const levels = this.handlerLevels;
    if (!levels || levels.length <= at) return;
    if (event === 'rollback') {
      this.batch?.truncate(levels[at]);
      this.committed?.splice(levels[at + 1]);
    }
    levels.length = at;
  }

  /**
   * Undoes what a claim made inside this transaction did, statements sent with the COMMIT and
   * after-commit callbacks included. Resolves once Postgres has rolled back to the savepoint.
   */
  async rollbackTo(savepoint: Savepoint): Promise<void> {
    this.batch?.truncate(savepoint.deferred);
    this.committed?.splice(savepoint.afterCommit);
    await this.openClient().query(`ROLLBACK TO SAVEPOINT ${savepoint.name}`);
  }

  /**
   * Runs `fn` once this transaction has committed, and never if it rolls back, nor if the level it
   * was registered in is rolled back: a claim made inside it rolled back to its savepoint, or a
   * transaction the handler opened on the runner (followHandlerLevel). Refused once the
   * transaction is over.
   */
  afterCommit(fn: () => unknown): void {
    this.openClient();
    (this.committed ??= []).push(fn);
  }

  /** The after-commit callbacks (see runAfterCommit in core/after-commit.ts). Call once the COMMIT has succeeded. */
  runAfterCommit(failed: (error: unknown) => void): Promise<void> {
    const callbacks = this.committed;
    this.committed = undefined;
    return callbacks ? runAfterCommit(callbacks, failed) : Promise.resolve();
  }

  /**
   * Commits, with what beforeCommit() collected, and says how that ended (CommitOutcome). With
   * `lose` (the testing helpers' crashBeforeCommit()), what a process killed just before its
   * COMMIT leaves instead: the transaction rolled back, as Postgres does for a lost session, and
   * the answer a lost connection gives, so the delivery goes down a real crash's path.
   */
  commit(lose = false): Promise<CommitOutcome> {
    if (lose) return this.loseCommit();
    if (this.pendingClaim) {
      // The claim at commit's row, without a response (none was recorded), in the COMMIT's query.
      try {
        this.collectPendingClaim(null);
      } catch (error) {
        // Nothing was sent: the transaction rolls back, and the delivery fails as its handler would.
        return this.rollbackQuietly().then(() => ({ kind: 'refused', error }));
      }
    }
    const client = this.client;
    // None deferred, or all rolled back to a savepoint (an empty list): the plain COMMIT.
    if (client && this.transactionActive && !this.options.subscribed && !this.batch?.length) {
      // The plain COMMIT, answered in one `.then` on its query: an async function awaiting end()
      // would make two promises more, each paying AsyncLocalStorage's hooks.
      return sendQuery(client, 'COMMIT').then(
        (result) => {
          this.forget();
          // Postgres answers the COMMIT of an aborted transaction with the tag ROLLBACK.
          if (result.command !== 'ROLLBACK') return COMMITTED;
          return { kind: 'rolled_back', error: new CommitRolledBackError() };
        },
        (error: unknown) => {
          this.forget();
          return this.commitFailed(error);
        },
      );
    }
    return this.end('COMMIT').then(
      () => COMMITTED,
      (error: unknown) => this.commitFailed(error),
    );
  }

  /** commit() with `lose`: the transaction rolled back and its answer lost, as for a crash. */
  private async loseCommit(): Promise<CommitOutcome> {
    this.batch = undefined;
    this.pendingClaim = undefined;
    this.committed = undefined;
    await this.rollbackQuietly();
    const error = new Error('Connection terminated before the COMMIT (crashBeforeCommit)');
    return { kind: 'unknown', error: Object.assign(error, { code: 'ECONNRESET' }) };
  }

  /** How a COMMIT that failed ended. The transaction is over; nothing (or, for `unknown`, perhaps everything) was written. */
  private async commitFailed(error: unknown): Promise<CommitOutcome> {
    if (error instanceof CommitRolledBackError) return { kind: 'rolled_back', error };
    await this.rollbackQuietly();
    if (
      isRetryable(error) ||
      error instanceof DeferredStatementMissError ||
      error instanceof ClaimTakenError
    ) {
      return { kind: 'retry', error };
    }
    if (isDataError(error)) return { kind: 'refused', error };
    return { kind: 'unknown', error };
  }

  /** Rolls back if a transaction is open; a lost connection has rolled back on its own. */
  async rollbackQuietly(): Promise<void> {
    try {
      await this.end('ROLLBACK');
    } catch {
      // The connection is gone; Postgres rolls the transaction back on its own.
    }
  }

  /**
   * Commits or rolls back, straight on the connection (TypeORM's commitTransaction() wraps one
   * statement in two broadcasts and its query layer, and cannot tell a COMMIT that Postgres turned
   * into a ROLLBACK). A COMMIT of a transaction a failed statement aborted rejects with
   * CommitRolledBackError: nothing was written.
   */
  end(action: 'COMMIT' | 'ROLLBACK'): Promise<void> {
    if (!this.transactionActive || !this.client) return Promise.resolve();
    if (this.options.subscribed) return this.endAndBroadcast(action);
    return this.send(this.client, action);
  }

  /**
   * See TransactionExecutor.beforeCommit: the statement goes out in the COMMIT's own simple query,
   * so a handler that hands its event off costs no round trip more than one that does not.
   * `mustWrite` wraps it so that no row returned becomes an error that carries the message (a cast
   * of the message to integer, evaluated only then), which stops the query before its COMMIT.
   */
  beforeCommit(text: string, values: readonly unknown[], mustWrite?: string): void {
    this.defer(text, values, mustWrite);
  }

  /** beforeCommit(), and for a companion of the claim how its session has it (DeferredStatement.preparedAs). */
  private defer(
    text: string,
    values: readonly unknown[],
    mustWrite: string | undefined,
    preparedAs?: string | null,
  ): void {
    const client = this.openClient();
    (this.batch ??= new CommitBatch()).add(client, text, values, mustWrite, preparedAs);
  }

  /**
   * Key checks: writes the handler's response into this transaction's claim, in the COMMIT's own
   * query (beforeCommit: no round trip), so that the claim, the handler's writes and the response
   * commit together or not at all. The claim is the one this transaction began with (its scope and
   * key are held since: nothing passes them back); a claim joined in a savepoint stores none (only
   * a route's own delivery, never a joined one, has a response to store). Without the checked
   * statements (a table not migrated), nothing is stored.
   */
  recordResponse(response: StoredResponse): void {
    const statement = this.options.statements.storeResponse;
    if (!statement || !this.claimValues) return;
    // Claimed at commit: the response goes into the claim's own insert; else the claim's row exists.
    if (this.pendingClaim) this.collectPendingClaim(response);
    else {
      const { scope, key } = this.claimValues;
      this.defer(statement.text, [scope, key, response], undefined, this.companion(statement));
    }
    this.recordedResponse = response;
  }

  /** Sends the claim at commit's row, with `response`, with the COMMIT (ClaimStatements.claimAtCommitInsert). */
  private collectPendingClaim(response: StoredResponse | null): void {
    const { scope, key, source, fingerprint = null } = this.pendingClaim!;
    const insert = this.options.statements.claimAtCommitInsert!;
    this.defer(insert.text, [scope, key, source, fingerprint, response], undefined, this.companion(insert));
    this.pendingClaim = undefined;
  }

  /** Key checks: the response recordResponse() sent with the COMMIT, for in-process duplicates. */
  recordedResponse?: StoredResponse;

  /** end() for a DataSource with subscribers: they hear of it as from commitTransaction(). */
  private async endAndBroadcast(action: 'COMMIT' | 'ROLLBACK'): Promise<void> {
    const broadcaster = this.runner.broadcaster;
    await broadcaster.broadcast(
      action === 'COMMIT' ? 'BeforeTransactionCommit' : 'BeforeTransactionRollback',
    );
    try {
      await this.send(this.client!, action);
    } catch (error) {
      // A failed COMMIT has rolled back: subscribers hear it, as they would from TypeORM's own
      // failed commitTransaction() followed by the caller's rollbackTransaction().
      if (action === 'COMMIT') {
        await broadcaster.broadcast('BeforeTransactionRollback');
        await broadcaster.broadcast('AfterTransactionRollback');
      }
      throw error;
    }
    await broadcaster.broadcast(action === 'COMMIT' ? 'AfterTransactionCommit' : 'AfterTransactionRollback');
  }

  private send(client: PoolClient, action: 'COMMIT' | 'ROLLBACK'): Promise<void> {
    const batch = this.batch;
    this.batch = undefined;
    // An empty batch (every statement rolled back to a savepoint) is none: CommitBatch.commit reads
    // one result per statement, and a query of the COMMIT alone is answered with one result, not a list.
    if (batch?.length && action === 'COMMIT') {
      return batch.commit(client, this.options, () => this.forget());
    }
    // Whatever the answer, the transaction is over (a failed COMMIT ends it too, or the connection).
    return sendQuery(client, action).then(
      (result) => {
        this.forget();
        // Postgres answers the COMMIT of an aborted transaction with the tag ROLLBACK.
        if (action === 'COMMIT' && result.command === 'ROLLBACK') throw new CommitRolledBackError();
      },
      (error: unknown) => {
        this.forget();
        throw error;
      },
    );
  }
}
