import type { Pool, PoolClient, QueryResult } from 'pg';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import { runAfterCommit } from '../core/after-commit.js';
import {
  fingerprintsConflict,
  type ClaimCheck,
  type ConflictState,
  type StoredResponse,
} from '../core/claim-check.js';
import type { ClaimHandle, TransactionExecutor } from '../core/claim-strategy.js';
import { processWide } from '../core/process-wide.js';
import { claimUnsettled } from '../idempotency.messages.js';
import { claimAfterSql, claimOnSessionSql, type ClaimStatements } from './claim.sql.js';
import {
  executeArguments,
  inlineLiterals,
  mustWriteStatement,
  literal,
  parameterLiterals,
  statementTemplate,
  type StatementTemplate,
} from './inline-parameters.js';
import {
  DUPLICATE_PREPARED_STATEMENT,
  errorCode,
  IN_FAILED_SQL_TRANSACTION,
  INVALID_TEXT_REPRESENTATION,
  isConnectionError,
  isDataError,
  isRetryable,
  isDuplicateKey,
} from './pg-errors.js';
import { connectClient, sendQuery } from './pg-promises.js';
import type { PreparedStatements } from './prepared-statements.js';
import { claimQuery, isPreparedStatementMiss, type ClaimStatement } from './statement-executor.js';
import {
  adoptTransaction,
  attachConnection,
  forgetTransaction,
  listenForErrors,
  releaseRunner,
  transactionDepth,
} from './typeorm-internals.js';

/** A statement to send with the COMMIT, its values already quoted. */
interface DeferredStatement {
  template: StatementTemplate;
  literals: readonly string[];
  /**
   * A companion of this transaction's claim (ClaimStatement.companions): the name its session has
   * it under, EXECUTEd; null where the claim ran inline, so the session may lack it: inlined.
   * Undefined for any other statement (a handoff's job): EXECUTEd under the template's name where
   * the connection has prepared it, else PREPAREd by the COMMIT itself; inlined while the module
   * does not prepare.
   */
  preparedAs?: string | null;
}

const claimTransactionOver = () =>
  `The claim transaction is over: SQL through the delivery's executor (and IdempotencyContext.enqueue()) must run inside the handler, before it returns`;

/**
 * Postgres answered COMMIT with ROLLBACK, or the statements sent with the COMMIT with 25P02: a
 * statement of the transaction had failed (and the handler caught it), so nothing was written.
 */
export class CommitRolledBackError extends Error {
  constructor() {
    super('the COMMIT was rolled back: a statement in the transaction failed and the handler went on');
    this.name = 'CommitRolledBackError';
  }
}

/**
 * Connections that have prepared a transaction claim, by statement name (one per claims table). A
 * pool's connections outlive any one module, and both builds of the library may use one pool
 * (see processWide).
 */
const preparedConnections = processWide('prepared-connections', () => new WeakMap<PoolClient, Set<string>>());

/**
 * The claim's answer when nothing was inserted needs at most a reclaim and a re-read to settle
 * (and, claimed at commit, a wait for the key's lock before them).
 */
const MAX_SETTLE_ROUNDS = 4;

/** The row the transaction claim answers with (see ClaimStatements.transactionClaim). */
interface ClaimRow {
  claimed: boolean;
  status: string | null;
  previous: string;
  /** Key checks only (claimStatements' `checked`): the claim's fingerprint and stored response. */
  fingerprint?: string | null;
  response?: StoredResponse | null;
  /** The claim at commit's only (ClaimStatements.claimAtCommit): whether it took the key's lock. */
  locked?: boolean;
}

/**
 * What a transaction-mode claim found, the one value the strategy acts on: the event is this
 * delivery's now (first claim, or one taken back from a failed attempt or an expired lease), it is
 * done already, or an external-mode lease on the same scope holds it (`secondsLeft` of its lease,
 * held for `heldMs` so far).
 */
export type ClaimFound =
  | { readonly kind: 'claimed'; readonly reclaimed: boolean; readonly conflict?: ConflictState }
  | { readonly kind: 'done'; readonly fingerprint?: string | null; readonly response?: StoredResponse | null }
  | {
      readonly kind: 'leased';
      readonly secondsLeft: number;
      readonly heldMs: number;
      readonly conflict?: ConflictState;
    }
  // Key checks (a ClaimCheck given): a failed claim or a lease of another fingerprint, refused.
  | { readonly kind: 'conflict'; readonly state: ConflictState };

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

const FIRST_CLAIM: ClaimFound = { kind: 'claimed', reclaimed: false };
const RECLAIMED: ClaimFound = { kind: 'claimed', reclaimed: true };
const DONE: ClaimFound = { kind: 'done' };

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
 * The claim's values: scope, key, source, and the lock_timeout that bounds a duplicate's wait;
 * with key checks (the checked statements), the delivery's fingerprint last.
 */
export type ClaimValues =
  | readonly [scope: string, key: string, source: string, lockTimeout: string]
  | readonly [scope: string, key: string, source: string, lockTimeout: string, fingerprint: string | null];

/**
 * A statement sent in place of the transaction claim that claims and does more in the same query
 * (the ordering guard's version check: ordered-claim.sql.ts, strategies/event-ordering.ts), so the
 * more costs no round trip. It takes the claim's values first (four, five with key checks) and answers the claim's columns
 * (`claimed`, `status`, `previous`), which settle() reads as the claim's; `answered` hears the
 * whole row first.
 */
export interface ClaimVariant {
  /** The statement, prepared once per connection like the claim. */
  readonly statement: ClaimStatement;
  /** Its parameters' types, for PREPARE: the claim's, then its own. */
  readonly types: readonly string[];
  /** Its values after the claim's. */
  readonly values: readonly string[];
  /** Hears the statement's row, before what the claim found is settled. */
  answered(row: Readonly<Record<string, unknown>>): void;
}

/**
 * A round whose PREPARE or EXECUTE finds the connection's prepared state other than this process
 * believed (42P05, 26000) did not run; it corrects the belief and goes again: the claim, then one
 * correction (which is all a direct connection after DEALLOCATE ALL needs). Behind a pooler in
 * transaction mode each round is a new transaction, possibly on another server connection, so the
 * correction can miss too: the last round inlines the claim, which cannot miss. A claim with
 * companions corrects by reading the session inside its transaction (claimOnSessionSql), which
 * cannot miss either.
 */
const MAX_ROUNDS = 3;

/** The isolation levels BEGIN takes; anything else is left to TypeORM's startTransaction() to reject. */
const ISOLATION_LEVELS = new Set(['READ UNCOMMITTED', 'READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']);

/** How the claim's transactions are run; fixed per DataSource and module. */
export interface ClaimTransactionOptions {
  /** The pg pool under the DataSource, which the transaction takes its connection from. */
  pool: Pool;
  /** The claims table's statements. */
  statements: ClaimStatements;
  /** Whether to prepare them now (the module's `preparedStatements`, and what it has seen). */
  prepared: PreparedStatements;
  /** The DataSource's `isolationLevel` option, if any. */
  isolationLevel?: string;
  /** Whether the DataSource has subscribers, which must hear of every transaction. */
  subscribed: boolean;
}

/**
 * A statement sent with the COMMIT (see beforeCommit) returned no row, so the COMMIT did not run:
 * a data error (SQLSTATE 22P02, as Postgres raised it), so the delivery fails as if its handler had
 * thrown, and nothing is written.
 */
export class DeferredWriteMissingError extends Error {
  readonly code = INVALID_TEXT_REPRESENTATION;
  constructor(message: string) {
    super(message);
    this.name = 'DeferredWriteMissingError';
  }
}

/**
 * The claim made at the COMMIT (ClaimStatements.claimAtCommitInsert) found the key's row written
 * since its claim read none: by a writer that takes no lock (a claim of the other mode, a failure
 * record, an older release), or committed between the claim's snapshot and its lock. The COMMIT
 * did not run and nothing was written; the delivery runs again from its claim, which now sees the
 * row (a replay, or a failed claim taken back). Thrown too by a claim at commit that waited for the
 * key under a snapshot that cannot see the holder's commit (above READ COMMITTED): it runs again.
 */
export class ClaimTakenError extends Error {
  /** `cause`: the database's error, when the COMMIT's insert met the row (its duplicate key). */
  constructor(options?: ErrorOptions) {
    super('the claim made at the COMMIT found its row written meanwhile; nothing was written', options);
    this.name = 'ClaimTakenError';
  }
}

/** The claims table's key (its primary key), as PostgreSQL lists it in a duplicate key's detail. */
const CLAIM_KEY_COLUMNS = 'scope, event_key';

/**
 * A statement sent with the COMMIT met a server connection whose prepared state was not what this
 * process believed (26000, 42P05: a transaction-mode pooler, DEALLOCATE ALL): nothing was written,
 * the belief is corrected, and the whole transaction may run again, as after a serialization
 * failure.
 */
export class DeferredStatementMissError extends Error {
  constructor(readonly code: string) {
    super(
      `a statement sent with the COMMIT missed its prepared state (SQLSTATE ${code}); nothing was written`,
    );
    this.name = 'DeferredStatementMissError';
  }
}

/**
 * One delivery's claim transaction, on a QueryRunner's own pg connection, with the round trips
 * and layers of the hand-written `BEGIN`/claim/`COMMIT`: the transaction is begun and claimed in
 * one query, then handed to TypeORM, so the handler's EntityManager sees an ordinary transaction
 * (its `manager.transaction()` nests as a savepoint, and what is sent with the COMMIT or run after
 * it goes with that savepoint: followHandlerLevel). TypeORM subscribers still hear of every
 * start, commit and rollback: when the DataSource has any, those go through the runner. Claims
 * made inside the delivery (propagation `required`) join it as savepoints (claimAt).
 */
export class ClaimTransaction implements TransactionExecutor, ClaimHandle {
  private client?: PoolClient;
  /** Statements to send with the COMMIT; undefined until beforeCommit() is called. */
  private deferred?: DeferredStatement[];
  /** The `mustWrite` messages of the deferred statements. */
  private mustWrite?: string[];
  /** Callbacks to run once the COMMIT has succeeded; undefined until afterCommit() is called. */
  private committed?: (() => unknown)[];
  /**
   * The levels the handler opened on the runner, outermost first (see followHandlerLevel): two
   * numbers each, the lengths of `deferred` and `committed` when it started. Undefined until the
   * handler opens one: a delivery that never does pays nothing.
   */
  private handlerLevels?: number[];
  /** The source of `signal`, made on first use. */
  private signals?: AbortController;
  /** Savepoints taken so far, for their names. */
  private savepoints = 0;
  /**
   * A claim made at the COMMIT (beginAndClaim's `atCommit`): the values of its row, which the
   * COMMIT's query inserts, with the response recordResponse() gives it, or none. Undefined once
   * the insert is collected (beforeCommit), and when the claim has its row already.
   */
  private pendingClaim?: ClaimValues;
  /**
   * The first claim of this transaction with companions (ClaimStatement.companions) that ran
   * prepared: its round PREPAREd them, or found the claim on the session, which holds them.
   */
  private preparedClaim?: ClaimStatement;
  /** release() was called: the runner's release from then on is ours, not a lost connection's. */
  private released = false;
  /**
   * Set by the ordering guard (strategies/event-ordering.ts) when the event is older than its
   * entity's applied version and the handler runs all the same (`runStale`): `context.stale`.
   */
  stale = false;

  /** The runner, once made (see `runner`). */
  private queryRunner?: QueryRunner;
  /** Whether the transaction is open, while no runner is made (the runner keeps it after). */
  private active = false;

  constructor(
    /** The DataSource whose pool the transaction takes its connection from, and its runner. */
    private readonly dataSource: DataSource,
    private readonly options: ClaimTransactionOptions,
  ) {}

  /**
   * The TypeORM runner on the transaction's connection, made when first asked for (the handler's
   * manager, subscribers, an isolation level for TypeORM to check), connected to the
   * transaction's client and told of its transaction then. A delivery that never asks (a replay,
   * a handler that writes through the executor only) makes none: a QueryRunner and its
   * EntityManager are a dozen objects per delivery.
   */
  get runner(): QueryRunner {
    if (this.queryRunner) return this.queryRunner;
    const runner = (this.queryRunner = this.dataSource.createQueryRunner());
    if (this.released) {
      // Asked for after the delivery: a released runner, whose manager refuses every query.
      releaseRunner(runner);
    } else if (this.client) {
      attachConnection(runner, this.client);
      if (this.active) adoptTransaction(runner);
    }
    return runner;
  }

  /** True when `runner` is this transaction's own runner (never makes one). */
  ownsRunner(runner: QueryRunner | undefined): boolean {
    return runner !== undefined && runner === this.queryRunner;
  }

  /** The EntityManager bound to this transaction. */
  get manager(): EntityManager {
    return this.runner.manager;
  }

  /** Whether the transaction is open: the runner's state once it is made, which TypeORM keeps too. */
  private get transactionActive(): boolean {
    return this.queryRunner ? this.queryRunner.isTransactionActive : this.active;
  }

  /** The transaction is open (BEGIN sent with the claim), for the runner too if made. */
  private adopt(): void {
    this.active = true;
    if (this.queryRunner) adoptTransaction(this.queryRunner);
  }

  /** The transaction is over (COMMIT or ROLLBACK sent straight on the connection). */
  private forget(): void {
    this.active = false;
    if (this.queryRunner) forgetTransaction(this.queryRunner);
  }

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
   * A connection from the DataSource's pool for beginAndClaim(): one promise, where TypeORM's
   * QueryRunner.connect() makes five and the pool's own promise form two.
   */
  connect(): Promise<PoolClient> {
    return connectClient(this.options.pool);
  }

  /**
   * Begins the transaction on `client` (from connect(), now this transaction's and its runner's)
   * and claims (scope, key, source) with the given lock_timeout, and says what the claim found.
   * With `variant`, that statement claims in the claim's place (and does more: the ordering
   * guard). With `atCommit` (a delivery that stores its response, on the checked statements), the
   * claim's row is written by the COMMIT, with the response (ClaimStatements.claimAtCommit):
   * except where TypeORM must hear of the transaction's start, or a snapshot that lasts the whole
   * transaction would hide the row a wait was for (an isolation level above READ COMMITTED). On
   * an error the transaction may be open: roll back.
   */
  beginAndClaim(
    client: PoolClient,
    values: ClaimValues,
    check?: ClaimCheck,
    variant?: ClaimVariant,
    atCommit = false,
  ): Promise<ClaimFound> {
    this.client = client;
    listenForErrors(client);
    const { isolationLevel, subscribed, statements } = this.options;
    const unknownLevel = isolationLevel !== undefined && !ISOLATION_LEVELS.has(isolationLevel);
    if (subscribed || unknownLevel) return this.beginAndClaimThroughRunner(client, values, check, variant);
    this.adopt();
    const begin = isolationLevel ? `BEGIN ISOLATION LEVEL ${isolationLevel}` : 'BEGIN';
    const claimsAtCommit =
      atCommit &&
      variant === undefined &&
      statements.claimAtCommit !== undefined &&
      (isolationLevel === undefined || isolationLevel === 'READ COMMITTED');
    return this.claimAfter(client, begin, 'ROLLBACK', values, check, variant, claimsAtCommit);
  }

  /**
   * beginAndClaim() where TypeORM must hear of the transaction's start: subscribers, or an
   * isolation level left to its startTransaction() to accept or reject.
   */
  private async beginAndClaimThroughRunner(
    client: PoolClient,
    values: ClaimValues,
    check?: ClaimCheck,
    variant?: ClaimVariant,
  ): Promise<ClaimFound> {
    const { statements, isolationLevel } = this.options;
    if (isolationLevel !== undefined && !ISOLATION_LEVELS.has(isolationLevel)) {
      await this.runner.startTransaction();
      const claim = variant?.statement ?? statements.transactionClaim;
      const claimed = await client.query(claimQuery(claim, [...values, ...(variant?.values ?? [])], false));
      variant?.answered(claimed.rows[0] as Record<string, unknown>);
      return this.settle(client, claimed.rows[0] as ClaimRow, values, check);
    }
    await this.runner.broadcaster.broadcast('BeforeTransactionStart');
    this.adopt();
    const begin = isolationLevel ? `BEGIN ISOLATION LEVEL ${isolationLevel}` : 'BEGIN';
    const row = await this.claimRow(client, begin, 'ROLLBACK', values, variant);
    await this.runner.broadcaster.broadcast('AfterTransactionStart');
    return this.settle(client, row, values, check);
  }

  /**
   * A savepoint for a claim made while this delivery runs (no round trip: it is sent with the
   * claim), marking what the transaction has collected so far.
   */
  savepoint(): Savepoint {
    this.openClient();
    return {
      name: `idempotency_claim_${++this.savepoints}`,
      deferred: this.deferred?.length ?? 0,
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
    if (runner !== this.queryRunner) return;
    // start: the depth before the level counts; commit and rollback: after it is uncounted. At 0,
    // the claim's own transaction is starting or over.
    const depth = transactionDepth(runner);
    if (!(depth >= 1)) return;
    const at = 2 * (depth - 1);
    if (event === 'start') {
      const deferred = this.deferred?.length ?? 0;
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
      this.deferred?.splice(levels[at]);
      this.committed?.splice(levels[at + 1]);
    }
    levels.length = at;
  }

  /**
   * Undoes what a claim made inside this transaction did, statements sent with the COMMIT and
   * after-commit callbacks included. Resolves once Postgres has rolled back to the savepoint.
   */
  async rollbackTo(savepoint: Savepoint): Promise<void> {
    this.deferred?.splice(savepoint.deferred);
    this.committed?.splice(savepoint.afterCommit);
    await this.openClient().query(`ROLLBACK TO SAVEPOINT ${savepoint.name}`);
  }

  /**
   * `head` (BEGIN, or a SAVEPOINT) and the claim as one simple-protocol query, and what it found.
   * The first round is one `.then` on the query, settled at once when the claim inserted its row
   * or found it done (the rows of nearly every delivery): an async function per step would be a
   * promise more each, and every promise pays AsyncLocalStorage's hooks. A round that missed its
   * prepared state, and rows that need more statements to settle, go the long way (claimRow, settle).
   */
  private claimAfter(
    client: PoolClient,
    head: string,
    undo: string,
    values: ClaimValues,
    check?: ClaimCheck,
    variant?: ClaimVariant,
    atCommit = false,
  ): Promise<ClaimFound> {
    const { statements } = this.options;
    const claim = this.claimStatement(variant, atCommit);
    const literals = claimLiterals(client, values, claim, variant);
    const how = this.howToSend(client, claim.name, 1);
    return sendQuery(client, claimAfterSql(statements, head, literals, how, claim, variant?.types)).then(
      (answer) => {
        const row = this.claimAnswered(client, answer, how, claim, variant);
        return this.settledAtOnce(row, values, check) ?? this.settle(client, row, values, check);
      },
      async (error: unknown) => {
        this.claimRoundFailed(client, error, how, claim.name, 1);
        await client.query(undo);
        const row = await this.claimRow(client, head, undo, values, variant, 2, atCommit);
        return this.settle(client, row, values, check);
      },
    );
  }

  /** The statement a claim is sent as: the variant's, the claim at commit, or the transaction claim. */
  private claimStatement(variant: ClaimVariant | undefined, atCommit: boolean): ClaimStatement {
    const { statements } = this.options;
    return variant?.statement ?? (atCommit ? statements.claimAtCommit! : statements.transactionClaim);
  }

  /**
   * What a claim's first row means when it needs no statement more: inserted (ours), claimed at
   * commit (ours, its row to be written by the COMMIT), or done. The first round of settle(),
   * without its promise; undefined for every other row.
   */
  private settledAtOnce(row: ClaimRow, values: ClaimValues, check?: ClaimCheck): ClaimFound | undefined {
    if (row.claimed) {
      if (row.locked) this.pendingClaim = values;
      return FIRST_CLAIM;
    }
    if (row.status !== 'done') return undefined;
    return check ? { kind: 'done', fingerprint: row.fingerprint, response: row.response } : DONE;
  }

  /** How round `round` of a claim sends it: inlined, EXECUTE, or PREPARE and EXECUTE. */
  private howToSend(
    client: PoolClient,
    name: string,
    round: number,
  ): 'inline' | 'execute' | 'prepare-and-execute' {
    if (!this.options.prepared.active || round === MAX_ROUNDS) return 'inline';
    return preparedConnections.get(client)?.has(name) ? 'execute' : 'prepare-and-execute';
  }

  /** The claim's row from its query's answer (one result per statement; the claim's is the last). */
  private claimAnswered(
    client: PoolClient,
    answer: QueryResult,
    how: 'inline' | 'execute' | 'prepare-and-execute',
    claim: ClaimStatement,
    variant?: ClaimVariant,
  ): ClaimRow {
    const results = answer as unknown as QueryResult[];
    if (how === 'prepare-and-execute') remember(client, claim.name, true);
    if (how !== 'inline' && claim.companions) this.preparedClaim ??= claim;
    const row = results[results.length - 1].rows[0] as ClaimRow;
    variant?.answered(row as unknown as Record<string, unknown>);
    return row;
  }

  /**
   * A claim round failed: what its PREPARE left on the connection is remembered, and the error
   * thrown again unless it is a prepared-state miss another round can correct.
   */
  private claimRoundFailed(
    client: PoolClient,
    error: unknown,
    how: 'inline' | 'execute' | 'prepare-and-execute',
    name: string,
    round: number,
  ): void {
    // The claim itself failed (a duplicate's lock_timeout, say) after its PREPARE had run,
    // and a PREPARE outlives the rollback: the connection has the statement. (A round that
    // failed between its companions' PREPAREs and the claim's leaves them without it: the next
    // EXECUTE misses, and the round after reads the session, claimOnSession.)
    if (how === 'prepare-and-execute' && !isPreparedStatementMiss(error) && !isConnectionError(error)) {
      remember(client, name, true);
    }
    if (round >= MAX_ROUNDS || !isPreparedStatementMiss(error)) throw error;
    const code = errorCode(error)!;
    this.options.prepared.missed(name, code);
    remember(client, name, code === DUPLICATE_PREPARED_STATEMENT);
  }

  /**
   * The claim's rounds from `round` on, as claimAfter() sends them, answering the claim's row: a
   * round that misses its prepared state is undone with `undo` and sent again (MAX_ROUNDS). After
   * a miss, a claim with companions sends `head` alone, reads which of its statements the session
   * has, and PREPAREs the rest with its EXECUTE (claimOnSessionSql): two round trips more, on that
   * round only. `head` then opens the transaction a round trip before the claim: a REPEATABLE READ
   * snapshot is taken at the read, and a handler's own queries sent meanwhile on a nested claim's
   * connection would run inside its savepoint.
   */
  private async claimRow(
    client: PoolClient,
    head: string,
    undo: string,
    values: ClaimValues,
    variant?: ClaimVariant,
    round = 1,
    atCommit = false,
  ): Promise<ClaimRow> {
    const { statements } = this.options;
    const claim = this.claimStatement(variant, atCommit);
    const literals = claimLiterals(client, values, claim, variant);
    for (; ; round++) {
      let how = this.howToSend(client, claim.name, round);
      try {
        let answer: QueryResult;
        if (how !== 'inline' && round > 1 && claim.companions) {
          // After a miss, a claim with companions reads what the session has (claimOnSessionSql).
          // Until its own query nothing is PREPAREd: a failure before it leaves nothing to remember.
          how = 'execute';
          await client.query(head);
          const names = [claim.name, ...claim.companions.map((companion) => companion.name)];
          const there = await preparedOn(client, names);
          if (!there.has(claim.name)) how = 'prepare-and-execute';
          const sent = await client.query(claimOnSessionSql(literals, claim, there, variant?.types));
          // One statement is answered one result, several an array: claimAnswered reads an array.
          answer = (Array.isArray(sent) ? sent : [sent]) as unknown as QueryResult;
          // Found there, or PREPAREd now: the connection has it either way.
          remember(client, claim.name, true);
        } else {
          answer = await client.query(claimAfterSql(statements, head, literals, how, claim, variant?.types));
        }
        return this.claimAnswered(client, answer, how, claim, variant);
      } catch (error) {
        this.claimRoundFailed(client, error, how, claim.name, round);
        await client.query(undo);
      }
    }
  }

  /**
   * What the claim's row means. Inserted: ours. Done: done. Failed (a handler that threw), or an
   * external-mode lease (the same scope claimed in the other mode): taken back when it is failed
   * or its lease has run out, else the lease is live. Not visible to the claim's snapshot
   * (committed by a concurrent delivery while the claim waited on it): read again. Gone since
   * (retention): claimed anew. These extra round trips happen only off the happy path; they go
   * unnamed, as they are rare.
   */
  private async settle(
    client: PoolClient,
    first: ClaimRow,
    values: ClaimValues,
    check?: ClaimCheck,
  ): Promise<ClaimFound> {
    const { statements } = this.options;
    const [scope, key, , lockTimeout] = values;
    // Key checks: the checked reclaim takes the delivery's fingerprint as its fifth value.
    const fingerprint = values.length > 4 ? [values[4]] : [];
    let row = first;
    for (let round = 1; round <= MAX_SETTLE_ROUNDS; round++) {
      // The claim at commit: the key's lock taken and no row (at once, or after the wait below).
      if (row.claimed && row.locked) {
        this.pendingClaim = values;
        return FIRST_CLAIM;
      }
      if (row.locked === false && row.status === null) {
        // Another delivery holds the key and has not committed: wait for it as for a claim's row
        // lock (lock_timeout, 55P03 when it runs out), then read the claim again.
        const wait = [scope, key, lockTimeout, first.previous];
        const [waited] = (await client.query(claimQuery(statements.claimAtCommitWait!, wait, false))).rows;
        // A snapshot taken for the whole transaction (a server, database or role default above
        // READ COMMITTED) cannot see what the holder committed: the delivery starts again.
        if (!waited.fresh_snapshots) throw new ClaimTakenError();
        row = (await client.query(claimQuery(statements.claimAtCommit!, [scope, key], false)))
          .rows[0] as ClaimRow;
        continue;
      }
      if (row.claimed) {
        // Claimed by a statement sent again: its RETURNING restored the bound it found, which
        // is the duplicate wait's, not the transaction's own.
        if (round > 1) {
          await client.query(claimQuery(statements.restoreLockTimeout, [first.previous], false));
        }
        return round > 1 ? RECLAIMED : FIRST_CLAIM;
      }
      if (row.status === 'done') {
        return check ? { kind: 'done', fingerprint: row.fingerprint, response: row.response } : DONE;
      }
      if (row.status === 'failed' || row.status === 'in_progress') {
        // Key checks: a claim left by a delivery of another fingerprint is refused before it is
        // taken over, or taken over and the conflict reported (see ClaimCheck).
        const conflict: ConflictState | undefined =
          check && fingerprintsConflict(check.fingerprint, row.fingerprint)
            ? row.status === 'failed'
              ? 'failed'
              : 'in_flight'
            : undefined;
        if (conflict && check!.refuse) return { kind: 'conflict', state: conflict };
        const reclaim = [scope, key, lockTimeout, first.previous, ...fingerprint];
        const reclaimed = await client.query(claimQuery(statements.transactionReclaim, reclaim, false));
        if (reclaimed.rowCount === 1)
          return conflict ? { kind: 'claimed', reclaimed: true, conflict } : RECLAIMED;
      }
      const [state] = (await client.query(claimQuery(statements.claimState, [scope, key], false))).rows;
      if (state?.status === 'in_progress' && state.live) {
        const conflict = check && fingerprintsConflict(check.fingerprint, state.fingerprint);
        if (conflict && check.refuse) return { kind: 'conflict', state: 'in_flight' };
        return {
          kind: 'leased',
          secondsLeft: Number(state.seconds_left),
          heldMs: Number(state.held_ms),
          ...(conflict ? { conflict: 'in_flight' as const } : {}),
        };
      }
      row = state
        ? {
            claimed: false,
            status: state.status as string,
            previous: first.previous,
            fingerprint: state.fingerprint,
            response: state.response,
          }
        : // Gone since (retention): claim it anew.
          ((await client.query(claimQuery(statements.transactionClaim, [...values], false)))
            .rows[0] as ClaimRow);
    }
    throw new Error(claimUnsettled(scope, key));
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
    if (client && this.transactionActive && !this.options.subscribed && !this.deferred?.length) {
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
    this.deferred = undefined;
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

  /** The transaction's connection while it is open; throws once it is over. */
  private openClient(): PoolClient {
    if (!this.client || !this.transactionActive || this.released) {
      throw new Error(claimTransactionOver());
    }
    return this.client;
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
   * True when the transaction's connection was lost before release(): TypeORM releases a runner
   * as soon as its pg client reports an error (a backend terminated while the handler waited
   * between statements, a server gone), and the handler's next statement through the manager
   * then fails with TypeORM's "already released" error rather than a database error.
   */
  get connectionLost(): boolean {
    return this.queryRunner !== undefined && this.queryRunner.isReleased && !this.released;
  }

  /**
   * Runs `text` on this transaction's own connection, inside the transaction: what a library that
   * takes a caller's connection (pg-boss's `db` option) writes through, so its rows commit or roll
   * back with the claim. TypeORM's manager.query() cannot serve there: it answers an UPDATE or a
   * DELETE with a [rows, count] pair. Refused once the transaction is over, so that a handler that
   * kept it cannot autocommit on a connection returned to the pool.
   */
  executeSql(text: string, values?: unknown[]): Promise<QueryResult> {
    let client: PoolClient;
    try {
      client = this.openClient();
    } catch (error) {
      return Promise.reject(error);
    }
    return client.query(text, values);
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
    const escape = (value: string) => client.escapeLiteral(value);
    let template = statementTemplate(text);
    let given = values;
    if (mustWrite !== undefined) {
      // The message is one more value, so the wrapped statement is one text, prepared once.
      const message = `$${template.parameters + 1}`;
      template = statementTemplate(mustWriteStatement(text, message));
      given = [...values, mustWrite];
    }
    // Quoted now, so a value that cannot be stored is refused to the handler that gave it.
    const literals = parameterLiterals(template, given, escape);
    if (mustWrite !== undefined) (this.mustWrite ??= []).push(mustWrite);
    (this.deferred ??= []).push({ template, literals, preparedAs });
  }

  /**
   * Key checks: writes the handler's response into this transaction's claim, in the COMMIT's own
   * query (beforeCommit: no round trip), so that the claim, the handler's writes and the response
   * commit together or not at all. Without the checked statements (a table not migrated), nothing
   * is stored.
   */
  recordResponse(scope: string, key: string, response: StoredResponse): void {
    const statement = this.options.statements.storeResponse;
    if (!statement) return;
    const pending = this.pendingClaim;
    // Claimed at commit: the response goes into the claim's own insert; any other claim's row exists.
    if (pending && pending[0] === scope && pending[1] === key) this.collectPendingClaim(response);
    else this.defer(statement.text, [scope, key, response], undefined, this.companion(statement));
    this.recordedResponse = response;
  }

  /** Sends the claim at commit's row, with `response`, with the COMMIT (ClaimStatements.claimAtCommitInsert). */
  private collectPendingClaim(response: StoredResponse | null): void {
    const [scope, key, source, , fingerprint = null] = this.pendingClaim!;
    const insert = this.options.statements.claimAtCommitInsert!;
    this.defer(insert.text, [scope, key, source, fingerprint, response], undefined, this.companion(insert));
    this.pendingClaim = undefined;
  }

  /**
   * How the COMMIT sends `statement`, a companion of the checked claims (DeferredStatement.preparedAs):
   * EXECUTEd where a claim round of this transaction left it on the session, else inlined.
   */
  private companion(statement: ClaimStatement): string | null {
    const companions = this.preparedClaim?.companions ?? [];
    return companions.find((companion) => companion.text === statement.text)?.name ?? null;
  }

  /**
   * Key checks: true when this transaction claims with the checked statements, whose claim takes a
   * fingerprint as its fifth value (a claim joining it passes one, null when it has none).
   */
  get checked(): boolean {
    return this.options.statements.storeResponse !== undefined;
  }

  /** Key checks: the response recordResponse() sent with the COMMIT, for in-process duplicates. */
  recordedResponse?: StoredResponse;

  /**
   * After the transaction rolled back: whether its claim was made at its COMMIT (a lock on the
   * key, no row yet) and the key's row is done now. A claim at commit holds its key by a lock, so
   * a delivery that committed the key between the claim's snapshot and its lock (ClaimTakenError's
   * moment) leaves its writes for this handler to meet, a unique key of its own, say: the
   * handler's failure is then that delivery's success, to replay, not to record. One
   * autocommitted read, on a failure only; false if it cannot be read.
   */
  async claimTakenMeanwhile(): Promise<boolean> {
    const pending = this.pendingClaim;
    if (!pending || !this.client || this.transactionActive) return false;
    try {
      const state = await this.client.query(
        claimQuery(this.options.statements.claimState, [pending[0], pending[1]], false),
      );
      return state.rows[0]?.status === 'done';
    } catch {
      return false;
    }
  }

  /**
   * Sends an autocommitted statement on this delivery's connection once its transaction is over
   * (a handler's failure record): no second pool connection, which a pool of one would never give.
   * Unnamed, as it is rare.
   */
  async afterwards(statement: ClaimStatement, values: unknown[]): Promise<void> {
    if (!this.client || this.transactionActive) throw new Error('the claim transaction is still open');
    await this.client.query(claimQuery(statement, values, false));
  }

  /**
   * Gives the connection back to the pool, at once; once, whoever calls it again. Nothing to
   * await (see releaseRunner).
   */
  release(): void {
    if (this.released) return;
    this.released = true;
    if (this.queryRunner) releaseRunner(this.queryRunner);
    // No runner made: the client goes back as the runner would give it (pg-pool drops a broken one).
    else this.client?.release();
  }

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

  /**
   * The deferred statements and the COMMIT as one simple query. Prepared (while the module
   * prepares its statements), each is `EXECUTE` of a statement the connection PREPAREd the first
   * time it sent it, in that same query, so Postgres plans it once per connection; otherwise its
   * text with the values inlined. A companion of the claim (the claim at commit's insert, a stored
   * response's UPDATE) is never PREPAREd here: its claim's round saw to it
   * (DeferredStatement.preparedAs), so a pooler's session cannot miss it and run the handler again.
   * A statement that fails stops the query before the COMMIT and leaves the transaction aborted: it
   * is rolled back here, so that the connection goes back to the pool clean, and the error is the
   * statement's (a prepared-state miss: retry it all).
   */
  private commitWithDeferred(client: PoolClient, deferred: DeferredStatement[]): Promise<void> {
    const { prepared } = this.options;
    const known = preparedConnections.get(client);
    const preparing = new Set<string>();
    const parts: string[] = [];
    for (const { template, literals, preparedAs } of deferred) {
      if (preparedAs !== undefined) {
        parts.push(
          preparedAs === null
            ? inlineLiterals(template, literals)
            : `EXECUTE ${preparedAs} ${executeArguments(literals)}`,
        );
        continue;
      }
      if (!prepared.active) {
        parts.push(inlineLiterals(template, literals));
        continue;
      }
      const { name } = template;
      if (!known?.has(name) && !preparing.has(name)) {
        preparing.add(name);
        parts.push(`PREPARE ${name} AS ${template.text}`);
      }
      parts.push(`EXECUTE ${name} ${executeArguments(literals)}`);
    }
    parts.push('COMMIT');
    // Answered in one `.then`, as the plain COMMIT is: an async function awaiting the query would
    // make two promises more on every request that stores a response or hands off a job.
    return sendQuery(client, parts.join(';\n')).then(
      (answer) => {
        this.forget();
        for (const name of preparing) remember(client, name, true);
        const results = answer as unknown as QueryResult[];
        // Postgres answers the COMMIT of an aborted transaction with the tag ROLLBACK.
        if (results[results.length - 1].command === 'ROLLBACK') throw new CommitRolledBackError();
      },
      (error: unknown) => this.deferredFailed(client, deferred, preparing, error),
    );
  }

  /**
   * The deferred statements' query failed: rolls back what it left, and throws what the failure
   * means (a prepared-state miss, a transaction aborted before the query, the claim taken
   * meanwhile, a `mustWrite` statement that wrote nothing, or the statement's own error).
   */
  private async deferredFailed(
    client: PoolClient,
    deferred: DeferredStatement[],
    preparing: Set<string>,
    error: unknown,
  ): Promise<never> {
    await client.query('ROLLBACK').catch(() => undefined);
    this.forget();
    if (isPreparedStatementMiss(error)) {
      const code = errorCode(error)!;
      // 42P05: a PREPARE found its name there already; 26000: an EXECUTE found it missing.
      for (const { template, preparedAs } of deferred) {
        const name = preparedAs ?? template.name;
        this.options.prepared.missed(name, code);
        remember(client, name, code === DUPLICATE_PREPARED_STATEMENT);
      }
      throw new DeferredStatementMissError(code);
    }
    // A statement of the handler's had failed (and the handler went on): the query's first
    // statement met the aborted transaction, so none of it ran, its PREPAREs included. That is
    // the plain COMMIT's ROLLBACK tag (CommitRolledBackError), not a COMMIT that may have run.
    if (errorCode(error) === IN_FAILED_SQL_TRANSACTION) throw new CommitRolledBackError();
    // PREPARE outlives the transaction's rollback: learn which of this query's ran before the
    // failing statement, so the next delivery on the connection does not PREPARE one again.
    if (preparing.size > 0) await this.relearnPrepared(client, preparing);
    if (this.claimTaken(error, deferred)) throw new ClaimTakenError({ cause: error });
    const missing =
      errorCode(error) === INVALID_TEXT_REPRESENTATION
        ? this.mustWrite?.find((message) => (error as Error).message.includes(message))
        : undefined;
    throw missing ? new DeferredWriteMissingError(missing) : error;
  }

  /**
   * The COMMIT's query failed on the claims table's key while it carried the claim at commit's
   * insert, the only statement it sends that inserts there: the key was taken meanwhile. A
   * duplicate of another unique index a user added to the table is not that: it fails the delivery.
   */
  private claimTaken(error: unknown, deferred: DeferredStatement[]): boolean {
    const { table, claimAtCommitInsert } = this.options.statements;
    return (
      deferred.some(({ template }) => template.text === claimAtCommitInsert?.text) &&
      isDuplicateKey(error, CLAIM_KEY_COLUMNS, table.name, table.schema)
    );
  }

  /** Asks the connection which of `names` it has prepared (after a query that failed part-way). */
  private async relearnPrepared(client: PoolClient, names: Set<string>): Promise<void> {
    try {
      const found = await preparedOn(client, names);
      for (const name of names) remember(client, name, found.has(name));
    } catch {
      // The connection is gone with what it prepared.
    }
  }

  private send(client: PoolClient, action: 'COMMIT' | 'ROLLBACK'): Promise<void> {
    const deferred = this.deferred;
    this.deferred = undefined;
    // An empty list (every statement rolled back to a savepoint) is none: commitWithDeferred reads
    // one result per statement, and a query of the COMMIT alone is answered with one result, not a list.
    if (deferred?.length && action === 'COMMIT') return this.commitWithDeferred(client, deferred);
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

/** Which of `names` the session behind `client` has prepared: one read of pg_prepared_statements. */
async function preparedOn(client: PoolClient, names: Iterable<string>): Promise<Set<string>> {
  const { rows } = await client.query<{ name: string }>(
    'SELECT name FROM pg_prepared_statements WHERE name = ANY($1)',
    [[...names]],
  );
  return new Set(rows.map((row) => row.name));
}

/** Records what `client` has prepared under `name`, as learnt from an answer. */
function remember(client: PoolClient, name: string, prepared: boolean): void {
  let names = preparedConnections.get(client);
  if (!names) preparedConnections.set(client, (names = new Set()));
  if (prepared) names.add(name);
  else names.delete(name);
}

/**
 * The claim's values as literals for the simple protocol, which takes no parameters: quoted as pg
 * quotes them, by literal() as the COMMIT's statements are (a delivery without a fingerprint has a
 * NULL one). As many as `claim` takes (ClaimStatement.parameters: the claim at commit, its scope and
 * key), then the variant's.
 */
function claimLiterals(
  client: PoolClient,
  values: ClaimValues,
  claim: ClaimStatement,
  variant?: ClaimVariant,
): string[] {
  const sent = claim.parameters === undefined ? values : values.slice(0, claim.parameters);
  const given = variant ? [...sent, ...variant.values] : sent;
  const escape = (value: string) => client.escapeLiteral(value);
  return given.map((value) => literal(value, escape));
}
