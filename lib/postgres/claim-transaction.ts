import type { PoolClient, QueryResult } from 'pg';
import type { EntityManager, QueryRunner } from 'typeorm';
import type { TransactionExecutor } from '../core/claim-strategy.js';
import { processWide } from '../core/process-wide.js';
import { claimTransactionOver, claimUnsettled } from '../idempotency.messages.js';
import { beginAndClaimSql, type ClaimStatements } from './claim.sql.js';
import {
  executeArguments,
  inlineParameters,
  statementTemplate,
  type StatementTemplate,
} from './inline-parameters.js';
import { DUPLICATE_PREPARED_STATEMENT, errorCode, INVALID_TEXT_REPRESENTATION } from './pg-errors.js';
import type { PreparedStatements } from './prepared-statements.js';
import { claimQuery, isPreparedStatementMiss, type ClaimStatement } from './statement-executor.js';

/** A statement to send with the COMMIT. */
interface DeferredStatement {
  template: StatementTemplate;
  values: readonly unknown[];
}
import { adoptTransaction, connectRunner, forgetTransaction } from './typeorm-internals.js';

/**
 * Postgres answered COMMIT with ROLLBACK: a statement of the transaction had failed (and the
 * handler caught it), so nothing was written.
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

/** The claim's answer when nothing was inserted needs at most a reclaim and a re-read to settle. */
const MAX_SETTLE_ROUNDS = 3;

/** The row the transaction claim answers with (see ClaimStatements.transactionClaim). */
interface ClaimRow {
  claimed: boolean;
  status: string | null;
  previous: string;
}

/**
 * A round whose PREPARE or EXECUTE finds the connection's prepared state other than this process
 * believed (42P05, 26000) did not run; it corrects the belief and goes again: the claim, then one
 * correction (which is all a direct connection after DEALLOCATE ALL needs). Behind a pooler in
 * transaction mode each round is a new transaction, possibly on another server connection, so the
 * correction can miss too: the last round inlines the claim, which cannot miss.
 */
const MAX_ROUNDS = 3;

/** The isolation levels BEGIN takes; anything else is left to TypeORM's startTransaction() to reject. */
const ISOLATION_LEVELS = new Set(['READ UNCOMMITTED', 'READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']);

/** How the claim's transactions are run; fixed per DataSource and module. */
export interface ClaimTransactionOptions {
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
 * One delivery's claim transaction, on a QueryRunner's own pg connection, with the round trips
 * and layers of the hand-written `BEGIN`/claim/`COMMIT`: the transaction is begun and claimed in
 * one query, then handed to TypeORM, so the handler's EntityManager sees an ordinary transaction
 * (its `manager.transaction()` nests as a savepoint). TypeORM subscribers still hear of every
 * start, commit and rollback: when the DataSource has any, those go through the runner.
 */
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

export class ClaimTransaction implements TransactionExecutor {
  private client?: PoolClient;
  /** Statements to send with the COMMIT; undefined until beforeCommit() is called. */
  private deferred?: DeferredStatement[];
  /** The `mustWrite` messages of the deferred statements. */
  private mustWrite?: string[];
  /** release() was called: the runner's release from then on is ours, not a lost connection's. */
  private released = false;

  constructor(
    private readonly runner: QueryRunner,
    private readonly options: ClaimTransactionOptions,
  ) {}

  /** The EntityManager bound to this transaction. */
  get manager(): EntityManager {
    return this.runner.manager;
  }

  /**
   * Begins the transaction and claims (scope, key, source) with the given lock_timeout. Resolves
   * true when the claim is ours, false when the key is already done. On an error the transaction
   * may be open: roll back.
   */
  async beginAndClaim(values: readonly [string, string, string, string]): Promise<boolean> {
    const client = (this.client = await connectRunner(this.runner));
    const { statements, prepared, isolationLevel, subscribed } = this.options;
    if (isolationLevel !== undefined && !ISOLATION_LEVELS.has(isolationLevel)) {
      // Left to TypeORM's startTransaction() to accept or reject.
      await this.runner.startTransaction();
      const claimed = await client.query(claimQuery(statements.transactionClaim, [...values], false));
      return this.settle(client, claimed.rows[0] as ClaimRow, values);
    }
    if (subscribed) await this.runner.broadcaster.broadcast('BeforeTransactionStart');
    adoptTransaction(this.runner);
    // BEGIN and the claim as one simple-protocol query (TypeORM's startTransaction() and a
    // parameterized claim take two round trips): `EXECUTE` of the prepared claim, with its
    // PREPARE in front the first time a connection sends it, or the claim inlined.
    const literals = values.map((value) => client.escapeLiteral(value));
    const { name } = statements.transactionClaim;
    let row: ClaimRow;
    for (let round = 1; ; round++) {
      const known = preparedConnections.get(client);
      const how =
        !prepared.active || round === MAX_ROUNDS
          ? 'inline'
          : known?.has(name)
            ? 'execute'
            : 'prepare-and-execute';
      try {
        // Several statements in one query answer with one result each; the claim's is the last.
        const results = (await client.query(
          beginAndClaimSql(statements, literals, how, isolationLevel),
        )) as unknown as QueryResult[];
        if (how === 'prepare-and-execute') remember(client, name, true);
        row = results[results.length - 1].rows[0] as ClaimRow;
        break;
      } catch (error) {
        if (round >= MAX_ROUNDS || !isPreparedStatementMiss(error)) throw error;
        const code = errorCode(error)!;
        prepared.missed(name, code);
        remember(client, name, code === DUPLICATE_PREPARED_STATEMENT);
        await client.query('ROLLBACK');
      }
    }
    if (subscribed) await this.runner.broadcaster.broadcast('AfterTransactionStart');
    return this.settle(client, row, values);
  }

  /**
   * What the claim's row means. Inserted: ours. Done: replayed. Failed (a handler that threw):
   * claimed here. Not visible to the claim's snapshot (committed by a concurrent delivery while
   * the claim waited on it): read again. These extra round trips happen only off the happy path;
   * they go unnamed, as they are rare.
   */
  private async settle(
    client: PoolClient,
    first: ClaimRow,
    values: readonly [string, string, string, string],
  ): Promise<boolean> {
    const { statements } = this.options;
    const [scope, key, , lockTimeout] = values;
    let row = first;
    for (let round = 1; round <= MAX_SETTLE_ROUNDS; round++) {
      if (row.claimed) return true;
      if (row.status === 'failed') {
        const reclaim = [scope, key, lockTimeout, first.previous];
        const reclaimed = await client.query(claimQuery(statements.transactionReclaim, reclaim, false));
        if (reclaimed.rowCount === 1) return true;
      } else if (row.status !== null) {
        return false;
      }
      const [state] = (await client.query(claimQuery(statements.claimState, [scope, key], false))).rows;
      row = state
        ? { claimed: false, status: state.status as string, previous: first.previous }
        : // Gone since (retention): claim it anew.
          ((await client.query(claimQuery(statements.transactionClaim, [...values], false)))
            .rows[0] as ClaimRow);
    }
    throw new Error(claimUnsettled(scope, key));
  }

  /**
   * Commits or rolls back, straight on the connection (TypeORM's commitTransaction() wraps one
   * statement in two broadcasts and its query layer, and cannot tell a COMMIT that Postgres turned
   * into a ROLLBACK). A COMMIT of a transaction a failed statement aborted rejects with
   * CommitRolledBackError: nothing was written.
   */
  end(action: 'COMMIT' | 'ROLLBACK'): Promise<void> {
    if (!this.runner.isTransactionActive || !this.client) return Promise.resolve();
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
    return this.runner.isReleased && !this.released;
  }

  /**
   * Runs `text` on this transaction's own connection, inside the transaction: what a library that
   * takes a caller's connection (pg-boss's `db` option) writes through, so its rows commit or roll
   * back with the claim. TypeORM's manager.query() cannot serve there: it answers an UPDATE or a
   * DELETE with a [rows, count] pair. Refused once the transaction is over, so that a handler that
   * kept it cannot autocommit on a connection returned to the pool.
   */
  executeSql(text: string, values?: unknown[]): Promise<QueryResult> {
    if (!this.client || !this.runner.isTransactionActive || this.released) {
      return Promise.reject(new Error(claimTransactionOver()));
    }
    return this.client.query(text, values);
  }

  /**
   * See TransactionExecutor.beforeCommit: the statement goes out in the COMMIT's own simple query,
   * so a handler that hands its event off costs no round trip more than one that does not.
   * `mustWrite` wraps it so that no row returned becomes an error that carries the message (a cast
   * of the message to integer, evaluated only then), which stops the query before its COMMIT.
   */
  beforeCommit(text: string, values: readonly unknown[], mustWrite?: string): void {
    if (!this.client || !this.runner.isTransactionActive || this.released) {
      throw new Error(claimTransactionOver());
    }
    const template = statementTemplate(text);
    const deferred = (this.deferred ??= []);
    if (mustWrite === undefined) {
      deferred.push({ template, values });
      return;
    }
    (this.mustWrite ??= []).push(mustWrite);
    // The message is one more value, so the wrapped statement is one text, prepared once.
    const message = `$${template.parameters + 1}`;
    const wrapped = `WITH written AS (${text}) SELECT (CASE WHEN count(*) = 0 THEN ${message} END)::int FROM written`;
    deferred.push({ template: statementTemplate(wrapped), values: [...values, mustWrite] });
  }

  /**
   * Sends an autocommitted statement on this delivery's connection once its transaction is over
   * (a handler's failure record): no second pool connection, which a pool of one would never give.
   * Unnamed, as it is rare.
   */
  async afterwards(statement: ClaimStatement, values: unknown[]): Promise<void> {
    if (!this.client || this.runner.isTransactionActive)
      throw new Error('the claim transaction is still open');
    await this.client.query(claimQuery(statement, values, false));
  }

  release(): Promise<void> {
    this.released = true;
    return this.runner.release();
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
   * text with the values inlined. A statement that fails stops the query before the COMMIT and
   * leaves the transaction aborted: it is rolled back here, so that the connection goes back to
   * the pool clean, and the error is the statement's (a prepared-state miss: retry it all).
   */
  private async commitWithDeferred(client: PoolClient, deferred: DeferredStatement[]): Promise<void> {
    const { prepared } = this.options;
    const escape = (value: string) => client.escapeLiteral(value);
    const known = preparedConnections.get(client);
    const preparing = new Set<string>();
    const parts: string[] = [];
    for (const { template, values } of deferred) {
      if (!prepared.active) {
        parts.push(inlineParameters(template.text, values, escape));
        continue;
      }
      const { name } = template;
      if (!known?.has(name) && !preparing.has(name)) {
        preparing.add(name);
        parts.push(`PREPARE ${name} AS ${template.text}`);
      }
      parts.push(`EXECUTE ${name} ${executeArguments(template, values, escape)}`);
    }
    parts.push('COMMIT');
    let results: QueryResult[];
    try {
      results = (await client.query(parts.join(';\n'))) as unknown as QueryResult[];
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      forgetTransaction(this.runner);
      if (isPreparedStatementMiss(error)) {
        const code = errorCode(error)!;
        // 42P05: a PREPARE found its name there already; 26000: an EXECUTE found it missing.
        for (const { template } of deferred) {
          prepared.missed(template.name, code);
          remember(client, template.name, code === DUPLICATE_PREPARED_STATEMENT);
        }
        throw new DeferredStatementMissError(code);
      }
      const missing =
        errorCode(error) === INVALID_TEXT_REPRESENTATION
          ? this.mustWrite?.find((message) => (error as Error).message.includes(message))
          : undefined;
      throw missing ? new DeferredWriteMissingError(missing) : error;
    }
    forgetTransaction(this.runner);
    for (const name of preparing) remember(client, name, true);
    // Postgres answers the COMMIT of an aborted transaction with the tag ROLLBACK.
    if (results[results.length - 1].command === 'ROLLBACK') throw new CommitRolledBackError();
  }

  private send(client: PoolClient, action: 'COMMIT' | 'ROLLBACK'): Promise<void> {
    const deferred = this.deferred;
    this.deferred = undefined;
    if (deferred && action === 'COMMIT') return this.commitWithDeferred(client, deferred);
    // Whatever the answer, the transaction is over (a failed COMMIT ends it too, or the connection).
    return client.query(action).then(
      (result) => {
        forgetTransaction(this.runner);
        // Postgres answers the COMMIT of an aborted transaction with the tag ROLLBACK.
        if (action === 'COMMIT' && result.command === 'ROLLBACK') throw new CommitRolledBackError();
      },
      (error: unknown) => {
        forgetTransaction(this.runner);
        throw error;
      },
    );
  }
}

/** Records what `client` has prepared under `name`, as learnt from an answer. */
function remember(client: PoolClient, name: string, prepared: boolean): void {
  let names = preparedConnections.get(client);
  if (!names) preparedConnections.set(client, (names = new Set()));
  if (prepared) names.add(name);
  else names.delete(name);
}
