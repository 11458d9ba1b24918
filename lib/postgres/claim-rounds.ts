import type { PoolClient, QueryResult } from 'pg';
import type { ClaimCheck } from '../core/claim-check.js';
import { claimAfterSql, claimOnSessionSql } from './claim.sql.js';
import {
  CLAIMED_AT_COMMIT,
  foundAtOnce,
  settleClaim,
  type ClaimFound,
  type ClaimRow,
} from './claim-row.reader.js';
import { literal } from './inline-parameters.js';
import { DUPLICATE_PREPARED_STATEMENT, errorCode, isConnectionError } from './pg-errors.js';
import { sendQuery } from './pg-promises.js';
import { preparedOn, preparedOnClient, remember } from './prepared-session.js';
import { claimQuery, isPreparedStatementMiss, type ClaimStatement } from './statement-executor.js';
import { listenForErrors } from './typeorm-internals.js';
import { TransactionSession } from './transaction-session.js';

/** The values of one claim, which its statements take in this order (claimParameters). */
export interface ClaimValues {
  /** The handler's scope. */
  readonly scope: string;
  /** The event's key. */
  readonly key: string;
  /** Stored with the claim, for reports. */
  readonly source: string;
  /** The lock_timeout that bounds a duplicate's wait (`'200ms'`). */
  readonly lockTimeout: string;
  /**
   * Key checks (the checked statements, which take it as their fifth value): the delivery's
   * fingerprint, null for none. Undefined on the unchecked statements, which take four values.
   */
  readonly fingerprint?: string | null;
}

/** The claim's values as its statements take them: scope, key, source, lock_timeout, [fingerprint]. */
export function claimParameters(values: ClaimValues): unknown[] {
  const { scope, key, source, lockTimeout, fingerprint } = values;
  return fingerprint === undefined
    ? [scope, key, source, lockTimeout]
    : [scope, key, source, lockTimeout, fingerprint];
}

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

/**
 * The claim's rounds on a claim transaction's connection: BEGIN (or a savepoint) and the claim in
 * one query, prepared once per connection, corrected and sent again where the session's prepared
 * state was other than believed (MAX_ROUNDS), and the claim's row read into what it found
 * (claim-row.reader.ts). The COMMIT and what goes with it are ClaimTransaction's.
 */
export class ClaimRounds extends TransactionSession {
  /**
   * A claim made at the COMMIT (beginAndClaim's `atCommit`): the values of its row, which the
   * COMMIT's query inserts, with the response recordResponse() gives it, or none. Undefined once
   * the insert is collected (beforeCommit), and when the claim has its row already.
   */
  protected pendingClaim?: ClaimValues;
  /** The values of the claim this transaction began with (beginAndClaim), kept for its response. */
  protected claimValues?: ClaimValues;
  /**
   * The first claim of this transaction with companions (ClaimStatement.companions) that ran
   * prepared: its round PREPAREd them, or found the claim on the session, which holds them.
   */
  protected preparedClaim?: ClaimStatement;

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
    this.claimValues = values;
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
      const claimed = await client.query(
        claimQuery(claim, [...claimParameters(values), ...(variant?.values ?? [])], false),
      );
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
   * `head` (BEGIN, or a SAVEPOINT) and the claim as one simple-protocol query, and what it found.
   * The first round is one `.then` on the query, settled at once when the claim inserted its row
   * or found it done (the rows of nearly every delivery): an async function per step would be a
   * promise more each, and every promise pays AsyncLocalStorage's hooks. A round that missed its
   * prepared state, and rows that need more statements to settle, go the long way (claimRow, settle).
   */
  protected claimAfter(
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
        const found = foundAtOnce(row, check);
        if (found === undefined) return this.settle(client, row, values, check);
        if (found === CLAIMED_AT_COMMIT) this.pendingClaim = values;
        return found;
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

  /** How round `round` of a claim sends it: inlined, EXECUTE, or PREPARE and EXECUTE. */
  private howToSend(
    client: PoolClient,
    name: string,
    round: number,
  ): 'inline' | 'execute' | 'prepare-and-execute' {
    if (!this.options.prepared.active || round === MAX_ROUNDS) return 'inline';
    return preparedOnClient(client, name) ? 'execute' : 'prepare-and-execute';
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

  /** settleClaim() for this transaction: a claim made at the COMMIT keeps its values for the insert. */
  private async settle(
    client: PoolClient,
    first: ClaimRow,
    values: ClaimValues,
    check?: ClaimCheck,
  ): Promise<ClaimFound> {
    const found = await settleClaim(client, this.options.statements, first, values, check);
    if (found === CLAIMED_AT_COMMIT) this.pendingClaim = values;
    return found;
  }

  /**
   * How the COMMIT sends `statement`, a companion of the checked claims (DeferredStatement.preparedAs):
   * EXECUTEd where a claim round of this transaction left it on the session, else inlined.
   */
  protected companion(statement: ClaimStatement): string | null {
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
        claimQuery(this.options.statements.claimState, [pending.scope, pending.key], false),
      );
      return state.rows[0]?.status === 'done';
    } catch {
      return false;
    }
  }
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
  const all = claimParameters(values);
  const sent = claim.parameters === undefined ? all : all.slice(0, claim.parameters);
  const given = variant ? [...sent, ...variant.values] : sent;
  const escape = (value: string) => client.escapeLiteral(value);
  return given.map((value) => literal(value, escape));
}
