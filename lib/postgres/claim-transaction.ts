import type { PoolClient, QueryResult } from 'pg';
import type { EntityManager, QueryRunner } from 'typeorm';
import { beginAndClaimSql, TRANSACTION_CLAIM } from './claim.sql.js';
import { DUPLICATE_PREPARED_STATEMENT, errorCode, UNKNOWN_PREPARED_STATEMENT } from './pg-errors.js';
import { claimQuery } from './statement-executor.js';
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

/** Connections that have prepared the transaction claim. A pool's connections outlive any one module. */
const preparedConnections = new WeakSet<PoolClient>();

/**
 * A round whose PREPARE or EXECUTE finds the connection's prepared state other than this process
 * believed (42P05, 26000) corrects the belief and goes again: the claim, one correction, and one
 * more for a pooler that hands the next round a different server connection.
 */
const MAX_ROUNDS = 3;

/** The isolation levels BEGIN takes; anything else is left to TypeORM's startTransaction() to reject. */
const ISOLATION_LEVELS = new Set(['READ UNCOMMITTED', 'READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']);

/** How the claim's transactions are run; fixed per DataSource and module. */
export interface ClaimTransactionOptions {
  /** The module's `preparedStatements` option. */
  prepared: boolean;
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
export class ClaimTransaction {
  private client?: PoolClient;
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
    const { prepared, isolationLevel, subscribed } = this.options;
    if (!prepared || (isolationLevel !== undefined && !ISOLATION_LEVELS.has(isolationLevel))) {
      await this.runner.startTransaction();
      return (await client.query(claimQuery(TRANSACTION_CLAIM, [...values], false))).rowCount === 1;
    }
    if (subscribed) await this.runner.broadcaster.broadcast('BeforeTransactionStart');
    adoptTransaction(this.runner);
    // `BEGIN; EXECUTE idempotency_transaction_claim(...)` as one simple-protocol query (TypeORM's
    // startTransaction() and a parameterized claim take two round trips), with the claim's
    // PREPARE in front the first time a connection sends it.
    const literals = values.map((value) => client.escapeLiteral(value));
    for (let round = 1; ; round++) {
      const prepare = !preparedConnections.has(client);
      try {
        // Several statements in one query answer with one result each; the claim's is the last.
        const results = (await client.query(
          beginAndClaimSql(literals, prepare, isolationLevel),
        )) as unknown as QueryResult[];
        preparedConnections.add(client);
        if (subscribed) await this.runner.broadcaster.broadcast('AfterTransactionStart');
        return results[results.length - 1].rowCount === 1;
      } catch (error) {
        const code = errorCode(error);
        if (round >= MAX_ROUNDS) throw error;
        if (code === DUPLICATE_PREPARED_STATEMENT) preparedConnections.add(client);
        else if (code === UNKNOWN_PREPARED_STATEMENT) preparedConnections.delete(client);
        else throw error;
        await client.query('ROLLBACK');
      }
    }
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

  private send(client: PoolClient, action: 'COMMIT' | 'ROLLBACK'): Promise<void> {
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
