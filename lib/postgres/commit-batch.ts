import type { PoolClient, QueryResult } from 'pg';
import type { ClaimStatements } from './claim.sql.js';
import {
  executeArguments,
  inlineLiterals,
  mustWriteStatement,
  parameterLiterals,
  statementTemplate,
  type StatementTemplate,
} from './inline-parameters.js';
import {
  DUPLICATE_PREPARED_STATEMENT,
  errorCode,
  IN_FAILED_SQL_TRANSACTION,
  INVALID_TEXT_REPRESENTATION,
  isDuplicateKey,
} from './pg-errors.js';
import { sendQuery } from './pg-promises.js';
import type { PreparedStatements } from './prepared-statements.js';
import { preparedOnClient, relearnPrepared, remember } from './prepared-session.js';
import { isPreparedStatementMiss } from './statement-executor.js';

/** A statement to send with the COMMIT, its values already quoted. */
export interface DeferredStatement {
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

/** What a batch is sent with: the claims table's statements and whether the module prepares. */
export interface CommitBatchSettings {
  /** The claims table's statements (the claim at commit's insert is told by its text). */
  readonly statements: ClaimStatements;
  /** Whether to prepare statements now (the module's `preparedStatements`, and what it has seen). */
  readonly prepared: PreparedStatements;
}

/**
 * The statements a claim transaction sends with its COMMIT (TransactionExecutor.beforeCommit, a
 * stored response, the claim at commit's insert), and the one simple query that sends them and
 * the COMMIT: a handler that hands its event off or stores its answer costs no round trip more
 * than one that does not. Made on the transaction's first such statement.
 */
export class CommitBatch {
  /** The statements, in the order they are sent. */
  private readonly deferred: DeferredStatement[] = [];
  /** The `mustWrite` messages of the statements. */
  private mustWrite?: string[];

  /** How many statements the batch holds. */
  get length(): number {
    return this.deferred.length;
  }

  /** Forgets the statements from the `length`th on (their savepoint or level was rolled back). */
  truncate(length: number): void {
    this.deferred.splice(length);
  }

  /**
   * Adds `text` with `values`, quoted now for `client`, so that a value that cannot be stored is
   * refused to the handler that gave it. `mustWrite` wraps it so that no row returned becomes an
   * error that carries the message (a cast of the message to integer, evaluated only then), which
   * stops the query before its COMMIT. `preparedAs`: see DeferredStatement.
   */
  add(
    client: PoolClient,
    text: string,
    values: readonly unknown[],
    mustWrite: string | undefined,
    preparedAs?: string | null,
  ): void {
    const escape = (value: string) => client.escapeLiteral(value);
    let template = statementTemplate(text);
    let given = values;
    if (mustWrite !== undefined) {
      // The message is one more value, so the wrapped statement is one text, prepared once.
      const message = `$${template.parameters + 1}`;
      template = statementTemplate(mustWriteStatement(text, message));
      given = [...values, mustWrite];
    }
    const literals = parameterLiterals(template, given, escape);
    if (mustWrite !== undefined) (this.mustWrite ??= []).push(mustWrite);
    this.deferred.push({ template, literals, preparedAs });
  }

  /**
   * The statements and the COMMIT as one simple query, on `client`; `over` is called once the
   * transaction is over, whatever the answer. Prepared (while the module prepares its
   * statements), each is `EXECUTE` of a statement the connection PREPAREd the first time it sent
   * it, in that same query, so Postgres plans it once per connection; otherwise its text with the
   * values inlined. A companion of the claim (the claim at commit's insert, a stored response's
   * UPDATE) is never PREPAREd here: its claim's round saw to it (DeferredStatement.preparedAs), so
   * a pooler's session cannot miss it and run the handler again. A statement that fails stops the
   * query before the COMMIT and leaves the transaction aborted: it is rolled back here, so that
   * the connection goes back to the pool clean, and the error is the statement's (a prepared-state
   * miss: retry it all). Rejects with CommitRolledBackError when the transaction was aborted.
   */
  commit(client: PoolClient, settings: CommitBatchSettings, over: () => void): Promise<void> {
    const { prepared } = settings;
    const preparing = new Set<string>();
    const parts: string[] = [];
    for (const { template, literals, preparedAs } of this.deferred) {
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
      if (!preparedOnClient(client, name) && !preparing.has(name)) {
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
        over();
        for (const name of preparing) remember(client, name, true);
        const results = answer as unknown as QueryResult[];
        // Postgres answers the COMMIT of an aborted transaction with the tag ROLLBACK.
        if (results[results.length - 1].command === 'ROLLBACK') throw new CommitRolledBackError();
      },
      (error: unknown) => this.failed(client, settings, preparing, error, over),
    );
  }

  /**
   * The batch's query failed: rolls back what it left, and throws what the failure means (a
   * prepared-state miss, a transaction aborted before the query, the claim taken meanwhile, a
   * `mustWrite` statement that wrote nothing, or the statement's own error).
   */
  private async failed(
    client: PoolClient,
    settings: CommitBatchSettings,
    preparing: Set<string>,
    error: unknown,
    over: () => void,
  ): Promise<never> {
    await client.query('ROLLBACK').catch(() => undefined);
    over();
    if (isPreparedStatementMiss(error)) {
      const code = errorCode(error)!;
      // 42P05: a PREPARE found its name there already; 26000: an EXECUTE found it missing.
      for (const { template, preparedAs } of this.deferred) {
        const name = preparedAs ?? template.name;
        settings.prepared.missed(name, code);
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
    if (preparing.size > 0) await relearnPrepared(client, preparing);
    if (this.claimTaken(error, settings.statements)) throw new ClaimTakenError({ cause: error });
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
  private claimTaken(error: unknown, statements: ClaimStatements): boolean {
    const { table, claimAtCommitInsert } = statements;
    return (
      this.deferred.some(({ template }) => template.text === claimAtCommitInsert?.text) &&
      isDuplicateKey(error, CLAIM_KEY_COLUMNS, table.name, table.schema)
    );
  }
}
