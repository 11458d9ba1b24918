import type { Pool, PoolClient, QueryResult } from 'pg';
import type { DataSource, EntityManager, QueryRunner } from 'typeorm';
import type { ClaimStatements } from './claim.sql.js';
import { connectClient } from './pg-promises.js';
import type { PreparedStatements } from './prepared-statements.js';
import { claimQuery, type ClaimStatement } from './statement-executor.js';
import { adoptTransaction, attachConnection, forgetTransaction, releaseRunner } from './typeorm-internals.js';

const claimTransactionOver = () =>
  `The claim transaction is over: SQL through the delivery's executor (and IdempotencyContext.enqueue()) must run inside the handler, before it returns`;

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
 * The connection a claim transaction runs on, and TypeORM's view of it: a pg client from the
 * DataSource's pool, and a QueryRunner adopted onto that client only when something asks for one
 * (the handler's manager, subscribers), told of the transaction the claim began by hand. What it
 * knows is whether the transaction is open, whether the connection was lost, and how to give it
 * back; the claim's rounds (ClaimRounds) and the transaction's COMMIT (ClaimTransaction) are
 * built on it.
 */
export class TransactionSession {
  /** The transaction's connection, once beginAndClaim() was given it. */
  protected client?: PoolClient;
  /** release() was called: the runner's release from then on is ours, not a lost connection's. */
  protected released = false;
  /** The runner, once made (see `runner`). */
  private queryRunner?: QueryRunner;
  /** Whether the transaction is open, while no runner is made (the runner keeps it after). */
  private active = false;

  constructor(
    /** The DataSource whose pool the transaction takes its connection from, and its runner. */
    private readonly dataSource: DataSource,
    protected readonly options: ClaimTransactionOptions,
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
  protected get transactionActive(): boolean {
    return this.queryRunner ? this.queryRunner.isTransactionActive : this.active;
  }

  /** The transaction is open (BEGIN sent with the claim), for the runner too if made. */
  protected adopt(): void {
    this.active = true;
    if (this.queryRunner) adoptTransaction(this.queryRunner);
  }

  /** The transaction is over (COMMIT or ROLLBACK sent straight on the connection). */
  protected forget(): void {
    this.active = false;
    if (this.queryRunner) forgetTransaction(this.queryRunner);
  }

  /**
   * A connection from the DataSource's pool for beginAndClaim(): one promise, where TypeORM's
   * QueryRunner.connect() makes five and the pool's own promise form two.
   */
  connect(): Promise<PoolClient> {
    return connectClient(this.options.pool);
  }

  /** The transaction's connection while it is open; throws once it is over. */
  protected openClient(): PoolClient {
    if (!this.client || !this.transactionActive || this.released) {
      throw new Error(claimTransactionOver());
    }
    return this.client;
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
}
