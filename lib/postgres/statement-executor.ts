import type { Pool, QueryConfig, QueryResult } from 'pg';
import type { DataSource } from 'typeorm';
import {
  DUPLICATE_PREPARED_STATEMENT,
  errorCode,
  isConnectionError,
  UNKNOWN_PREPARED_STATEMENT,
} from './pg-errors.js';
import { sendQuery } from './pg-promises.js';
import type { PreparedStatements } from './prepared-statements.js';
import { pgPoolOf } from './typeorm-internals.js';

/** A statement of the per-delivery path, with the name pg prepares it under. */
export interface ClaimStatement {
  readonly name: string;
  readonly text: string;
  /**
   * A claim statement sent with its first `parameters` values alone (the claim at commit: scope
   * and key), its SQL-level PREPARE declaring as many; part of its name (statementName). Default:
   * undefined, sent with all of the claim's values.
   */
  readonly parameters?: number;
  /**
   * Statements PREPAREd before this one (just before it in its query, or found there by a read of
   * the session, claimOnSessionSql), and part of its name (claimWithCompanions): a server session
   * that has this statement has them too, so a transaction whose claim ran prepared may EXECUTE
   * them at its COMMIT even behind a transaction-mode pooler (the claim at commit's insert, a
   * stored response's UPDATE). Such a statement is only ever PREPAREd with them (claimAfterSql),
   * never sent as a named protocol statement (claimQuery). Default: none.
   */
  readonly companions?: readonly ClaimStatement[];
}

/**
 * The pg query for `statement`. Named, pg parses it once per connection and Postgres reuses the
 * plan on every later delivery; unnamed, it is parsed and planned each time (still one round
 * trip: Parse, Bind and Execute travel together), which a transaction-mode pooler needs.
 */
export function claimQuery(statement: ClaimStatement, values: unknown[], prepared: boolean): QueryConfig {
  if (!prepared) return { text: statement.text, values };
  // Named here, it would be on the session without its companions, which its name promises.
  if (statement.companions) throw new Error(`${statement.name} is prepared with its companions only`);
  return { name: statement.name, text: statement.text, values };
}

/** True for an error of a statement that did not run because of the connection's prepared state. */
export function isPreparedStatementMiss(error: unknown): boolean {
  const code = errorCode(error);
  return code === UNKNOWN_PREPARED_STATEMENT || code === DUPLICATE_PREPARED_STATEMENT;
}

/**
 * Sends for a statement that survives a lost connection: the first, and two more on fresh
 * connections. pg-pool destroys a connection whose query failed, but the connection a handler's
 * QueryRunner lost may already sit idle in the pool as healthy (a terminated backend's error
 * arrives before its socket closes), and be handed to the next query.
 */
const MAX_CONNECTION_SENDS = 3;
/** Pause before each resend, in ms: a restarting server or a failover needs a moment. */
const RESEND_DELAYS_MS = [0, 50, 250];

/**
 * Sends autocommitted claim statements on the DataSource's pg pool, as hand-written SQL would:
 * no QueryRunner, prepared while `prepared` says so. A statement that misses its prepared state
 * (see PreparedStatements) did not run, so it is sent again at once, unprepared.
 */
export class StatementExecutor {
  constructor(
    private readonly dataSource: DataSource,
    private readonly prepared: PreparedStatements,
  ) {}

  /**
   * Sends `statement` autocommitted on the pool; one prepared-state miss is sent again unprepared.
   * Promise chains rather than async functions: each async layer is two promises more on every
   * delivery (see pg-promises.ts).
   */
  execute(statement: ClaimStatement, parameters: unknown[]): Promise<QueryResult> {
    let pool: Pool;
    let named: QueryConfig | undefined;
    try {
      pool = pgPoolOf(this.dataSource);
      if (this.prepared.active) named = claimQuery(statement, parameters, true);
    } catch (error) {
      // A destroyed DataSource has no pool (or the statement may not be named): a rejection, as
      // from the async function this was.
      return Promise.reject(error);
    }
    if (!named) return sendQuery(pool, claimQuery(statement, parameters, false));
    return sendQuery(pool, named).catch((error: unknown) => {
      if (!isPreparedStatementMiss(error)) throw error;
      this.prepared.missed(statement.name, errorCode(error)!);
      return sendQuery(pool, claimQuery(statement, parameters, false));
    });
  }

  /**
   * execute() for statements that are safe to send twice (the fenced updates, a claim under the
   * same token): a connection-class failure is sent again on a fresh connection, bounded, so a
   * lost connection costs a resend rather than a lease that stays in progress. `resent` tells the
   * caller an earlier send may have run without its answer arriving.
   */
  executeResending(
    statement: ClaimStatement,
    parameters: unknown[],
  ): Promise<{ result: QueryResult; resent: boolean }> {
    return this.execute(statement, parameters).then(
      (result) => ({ result, resent: false }),
      (error: unknown) => this.resend(statement, parameters, error),
    );
  }

  /** The sends after the first of executeResending(), which failed with `error`. */
  private async resend(
    statement: ClaimStatement,
    parameters: unknown[],
    error: unknown,
  ): Promise<{ result: QueryResult; resent: boolean }> {
    for (let send = 1; ; send++) {
      if (send >= MAX_CONNECTION_SENDS || !isConnectionError(error)) throw error;
      await new Promise((resolve) => setTimeout(resolve, RESEND_DELAYS_MS[send]));
      try {
        return { result: await this.execute(statement, parameters), resent: true };
      } catch (failed) {
        error = failed;
      }
    }
  }
}
