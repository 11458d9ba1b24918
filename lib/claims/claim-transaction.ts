import type { PoolClient, QueryResult } from 'pg';
import type { EntityManager, QueryRunner } from 'typeorm';
import { errorCode, TransactionAbortedError, UNKNOWN_PREPARED_STATEMENT } from './claim-result.js';
import { claimQuery } from './claim-statement.js';
import { beginAndClaimSql, TRANSACTION_CLAIM } from './claim.sql.js';

/** Connections that have prepared the transaction claim. A pool's connections outlive any one module. */
const preparedConnections = new WeakSet<PoolClient>();

/** PREPARE of a name the connection already has (another module on the same pool got there first). */
const DUPLICATE_PREPARED_STATEMENT = '42P05';
/** One round to learn the connection's real state, one to claim. */
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

/** What TypeORM's startTransaction() sets; TypeORM has no API to adopt a transaction begun on its connection. */
interface TransactionState {
  isTransactionActive: boolean;
  transactionDepth: number;
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
    const client = (this.client = (await this.runner.connect()) as PoolClient);
    const { prepared, isolationLevel, subscribed } = this.options;
    if (!prepared || (isolationLevel !== undefined && !ISOLATION_LEVELS.has(isolationLevel))) {
      await this.runner.startTransaction();
      return (await client.query(claimQuery(TRANSACTION_CLAIM, [...values], false))).rowCount === 1;
    }
    if (subscribed) await this.runner.broadcaster.broadcast('BeforeTransactionStart');
    // Adopted before BEGIN is sent, as startTransaction() does, so that a failure rolls back.
    const state = this.runner as unknown as TransactionState;
    state.isTransactionActive = true;
    state.transactionDepth = 1;
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
   * TransactionAbortedError: nothing was written.
   */
  end(action: 'COMMIT' | 'ROLLBACK'): Promise<void> {
    if (!this.runner.isTransactionActive || !this.client) return Promise.resolve();
    if (this.options.subscribed) return this.endAndBroadcast(action);
    return this.send(this.client, action);
  }

  release(): Promise<void> {
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
    const state = this.runner as unknown as TransactionState;
    // Whatever the answer, the transaction is over (a failed COMMIT ends it too, or the connection).
    const ended = () => {
      state.isTransactionActive = false;
      state.transactionDepth = 0;
    };
    return client.query(action).then(
      (result) => {
        ended();
        // Postgres answers the COMMIT of an aborted transaction with the tag ROLLBACK.
        if (action === 'COMMIT' && result.command === 'ROLLBACK') throw new TransactionAbortedError();
      },
      (error: unknown) => {
        ended();
        throw error;
      },
    );
  }
}
