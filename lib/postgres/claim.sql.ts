/**
 * Every statement a delivery sends, in one place (the reporter's are in maintenance.sql.ts), built
 * once per module for its table. Parameters are positional; times come from the database clock
 * (`now()`), never Node's, so replicas with skewed clocks agree on lease expiry. Each has a name:
 * pg prepares it once per connection, and Postgres then skips parsing and planning it (see
 * `preparedStatements`).
 */
import { createHash } from 'node:crypto';
import type { ClaimTable } from './claim-table.js';
import type { ClaimStatement } from './statement-executor.js';

/**
 * Raises `synchronous_commit` to `on` for the rest of the statement's transaction when the server,
 * database or role default is weaker: `off`, `local` or `remote_write` (a standby that has written
 * the WAL but not flushed it loses it in a crash). `remote_apply`, stronger, is kept. A completion
 * is the one write that must not be lost once its answer is sent: with `off`, a crash (or a
 * failover to a standby that never received it) after the answer forgets a `done`, and the
 * redelivery runs the work a second time. With `on` the COMMIT returns only once the WAL is
 * flushed here and, with `synchronous_standby_names`, on the synchronous standby (docs/failover.md).
 * Exported for the ordered claim (ordered-claim.sql.ts), which commits the same way.
 */
export const DURABLE_COMMIT = `set_config('synchronous_commit',
  CASE WHEN current_setting('synchronous_commit') IN ('off', 'local', 'remote_write') THEN 'on'
       ELSE current_setting('synchronous_commit') END, true)`;

/** The per-delivery statements of one claims table. */
export interface ClaimStatements {
  readonly table: ClaimTable;
  /**
   * Transaction mode claim. The CTE bounds how long a concurrent duplicate waits on the first
   * delivery's uncommitted claim (`lock_timeout`, SQLSTATE 55P03 when it runs out) without a
   * separate `SET LOCAL` round trip, and RETURNING restores the previous value once the claim is
   * ours, so the handler's own statements are not bound by it. Rows commit as `done`: the commit is
   * the completion. DO NOTHING keeps a replay read-only (DO UPDATE would lock and dirty the done
   * row); when nothing was inserted, `status` says what the statement's snapshot sees instead:
   * `done` (replayed), `failed` (a handler that threw: claim it with `transactionReclaim`),
   * `in_progress` (an external-mode lease on the same scope: reclaimed once it has expired, in
   * flight while it is live), or null for a row committed after the snapshot (read it again with
   * `claimState`). `previous` is the
   * lock_timeout to restore after a reclaim. The COMMIT is the completion, so it runs with
   * synchronous_commit at least `on` (DURABLE_COMMIT).
   * $1 scope, $2 key, $3 source, $4 lock_timeout ('5000ms').
   */
  readonly transactionClaim: ClaimStatement;
  /**
   * Claims, in transaction mode, a row another delivery left unfinished: `failed` (a handler that
   * threw), or an external-mode lease whose time ran out (its worker died; the scope's handler
   * switched modes in a deploy, or two handlers of different modes share the scope). Done
   * (uncommitted), attempts + 1, the lease's token cleared so its old holder's fenced completion
   * matches nothing, under the same lock_timeout bound, restoring `previous` once it is ours. No
   * row: another delivery got there, or the lease is still live.
   * $1 scope, $2 key, $3 lock_timeout, $4 the lock_timeout to restore.
   */
  readonly transactionReclaim: ClaimStatement;
  /**
   * A transaction-mode handler's failure, recorded after its transaction rolled back (so outside
   * it): a failed row with attempts and the error, which the next delivery claims again and the
   * reporter shows as poison once attempts reach `maxAttempts`. It never touches a done row, and
   * gives up at once rather than wait on a duplicate's uncommitted claim (lock_timeout).
   * $1 scope, $2 key, $3 source, $4 error, $5 lock_timeout.
   */
  readonly transactionFailure: ClaimStatement;
  /**
   * External mode claim: new key → in_progress; expired in_progress or failed → re-claimed with a
   * new token and attempts + 1. When nothing is claimed it returns no row, and `claimState` says
   * why (done, or a live lease and its seconds left): a duplicate costs a second round trip. A
   * plain upsert on purpose: answering the duplicate from the same statement (a writable CTE and a
   * UNION ALL of the state read) saved that round trip but made every new key's claim about 11%
   * more expensive in PostgreSQL (measured side by side, 10 connections), and most deliveries are
   * new keys. Sent again with the same token (its answer was lost with the connection), it takes
   * back its own lease rather than finding it held. An open transaction-mode claim of the same
   * scope (a handler that switched modes) holds the row's lock: the wait for it is bounded as a
   * transaction-mode duplicate's is (`lock_timeout`, local to the statement's own transaction),
   * and answered in flight when it runs out.
   * $1 scope, $2 key, $3 source, $4 lease token, $5 lease ms, $6 lock_timeout ('5000ms').
   */
  readonly leaseClaim: ClaimStatement;
  /**
   * Why a claim returned no row: done, or a live lease (how long it has left, in whole seconds, at
   * least 1, and how long it has been held, in ms, for a Retry-After that follows the handler's
   * usual time); and whose token holds it, to tell a resent fenced update that found nothing to
   * change whether its first send ran. $1 scope, $2 key.
   */
  readonly claimState: ClaimStatement;
  /**
   * Fenced completion: only the holder of the current token marks the event done, durably
   * (DURABLE_COMMIT). $1 scope, $2 key, $3 token.
   */
  readonly leaseComplete: ClaimStatement;
  /** Fenced release after a failure: the next delivery re-claims at once. $1 scope, $2 key, $3 token, $4 error. */
  readonly leaseFail: ClaimStatement;
  /**
   * Fenced removal after the handler refused its input (a 4xx): as in transaction mode, a refusal
   * leaves no claim, so it is neither a failed attempt nor, repeated, a poison event. $1 scope,
   * $2 key, $3 token.
   */
  readonly leaseRefuse: ClaimStatement;
  /** Fenced renewal. $1 scope, $2 key, $3 token, $4 lease ms. */
  readonly leaseExtend: ClaimStatement;
  /** For `expireLease()` in tests: ends an in-progress lease now, as if its worker had died. $1 scope, $2 key. */
  readonly expireLease: ClaimStatement;
  /** The current attempt number of a claim, for the lease-lost log. $1 scope, $2 key. */
  readonly currentAttempt: ClaimStatement;
  /**
   * Puts back the lock_timeout the transaction had before its claim, where the statement that
   * claimed did not (a claim sent again after retention removed the row it first met). $1 the value.
   */
  readonly restoreLockTimeout: ClaimStatement;
  /**
   * Key checks only (`checked`): the handler's response, written by the claim's own
   * COMMIT (sent with it, see TransactionExecutor.beforeCommit) into a row the claim inserted or
   * took back (an RPC reply's, a request's that took back a failed claim; a request's first claim
   * writes its row and response in one insert, `claimAtCommitInsert`). $1 scope, $2 key, $3 response.
   */
  readonly storeResponse?: ClaimStatement;
  /**
   * Key checks only: the claim of a delivery that stores its response (request mode), made at its
   * COMMIT (see ClaimTransaction.beginAndClaim). In place of the transaction claim, it takes a
   * transaction-scoped advisory lock on the key without waiting and reads the claim row. Locked
   * and no row: the key is this delivery's, and `claimAtCommitInsert`, sent with the COMMIT, writes
   * its row and response in one insert (where the claim and `storeResponse` write it twice: one
   * UPDATE less per request, see bench/README). Not locked and no row: another delivery holds it
   * and has not committed (`claimAtCommitWait`). A row: as the transaction claim's answer. Every
   * other writer of the row (a claim of the other mode, a failure record, an older release) goes
   * on through the unique index: the insert at COMMIT meets its row and the delivery is retried.
   * Answers the transaction claim's columns, and `locked`. It sets `synchronous_commit` as the
   * transaction claim does (DURABLE_COMMIT). $1 scope, $2 key: sent with these two alone
   * (`parameters`; each value more is one literal more for PostgreSQL to parse), the claim's
   * others go with the insert.
   */
  readonly claimAtCommit?: ClaimStatement;
  /**
   * After `claimAtCommit` found the key locked and no row: waits for the lock under lock_timeout
   * (55P03 when it runs out: in flight), then restores the transaction's own. The claim is read
   * again after it, in a statement of its own, whose snapshot sees what the holder committed:
   * `fresh_snapshots` says whether it can (READ COMMITTED: a snapshot per statement).
   * $1 scope, $2 key, $3 lock_timeout, $4 the lock_timeout to restore.
   */
  readonly claimAtCommitWait?: ClaimStatement;
  /**
   * The claim row of `claimAtCommit`, done, with the delivery's fingerprint and response, sent
   * with the COMMIT. A row already there (written by a delivery that took no lock, or committed
   * between the claim's snapshot and its lock) is not overwritten: the insert fails on the key
   * (23505), which stops the query before its COMMIT, and the delivery runs again
   * from its claim (ClaimTakenError). A plain insert rather than `ON CONFLICT DO NOTHING RETURNING`
   * wrapped to fail on no row: the same answer for less of PostgreSQL's work (bench/README, what
   * storing a response costs). Prepared with `claimAtCommit` (its companion, under a name of its
   * own there), never by the COMMIT: EXECUTEd where the claim ran prepared, inlined where it did not.
   * $1 scope, $2 key, $3 source, $4 fingerprint, $5 response.
   */
  readonly claimAtCommitInsert?: ClaimStatement;
}

/**
 * The name a statement is prepared under: its role and a hash of its text, and of `parameters`
 * for a statement sent with that many values (ClaimStatement.parameters). A connection's prepared
 * statements outlive the process that prepared them (a pooler hands its server connections to
 * every client, across a rolling deploy), and two releases of the library, or two copies of it in
 * one process, may word one statement differently, or PREPARE the same text with another count of
 * parameters: with both in the name, a PREPARE that finds the name taken (42P05) has found this
 * very statement, and an EXECUTE can never run another's, nor send it too few or too many values.
 * `companions` (ClaimStatement.companions) are named too: a session holding a statement under this
 * name was given them before it, which no other release's statement promises.
 */
export function statementName(
  role: string,
  text: string,
  parameters?: number,
  companions: readonly ClaimStatement[] = [],
): string {
  const hash = createHash('sha256').update(text);
  if (parameters !== undefined) hash.update(`\n${parameters} parameters`);
  for (const companion of companions) hash.update(`\nprepared with ${companion.name}`);
  return `idempotency_${role}_${hash.digest('hex').slice(0, 16)}`;
}

/** A statement to PREPARE with a claim (ClaimStatement.companions), and the role it is named for. */
export interface Companion {
  readonly role: string;
  readonly statement: ClaimStatement;
}

/**
 * The claim statement of `role`, `text` and `parameters` (statementName), with `companions`
 * PREPAREd just before it in its query (ClaimStatement.companions), the two named for each other.
 * Each companion's name hashes the claim's own, so no other claim, of this release or another,
 * PREPAREs a statement under it (a statement several claims carry, storeResponse, has a name with
 * each); and the claim's name hashes theirs, so a session holding it was given them before it
 * (in its query, or found there by claimOnSessionSql's read).
 */
export function claimWithCompanions(
  role: string,
  text: string,
  parameters: number | undefined,
  companions: readonly Companion[],
): ClaimStatement {
  const own = statementName(role, text, parameters);
  const prepared = companions.map(({ role: companionRole, statement }) => ({
    name: statementName(companionRole, `${statement.text}\nprepared with ${own}`),
    text: statement.text,
  }));
  return {
    name: statementName(role, text, parameters, prepared),
    text,
    ...(parameters !== undefined && { parameters }),
    companions: prepared,
  };
}

/** A statement of claimStatements(), named (statementName) for its table. */
type Named = (
  role: string,
  text: string,
  parameters?: number,
  companions?: readonly Companion[],
) => ClaimStatement;

/**
 * The statements for `table`. With `checked` (handlers with key checks: `@IdempotentRequest`,
 * `@IdempotentWebhook`), the same roles and the same round trips with the `fingerprint` and
 * `response` columns of migration 1765584000000: each takes what it adds as its last parameters,
 * so a strategy appends them to the values it sends either way, and `storeResponse` is added.
 * Each text differs from its unchecked twin, so its name (statementName) does too. Handlers
 * without checks (`@Idempotent`, `IdempotencyService.run()`), and every handler on a table
 * without the columns, use the unchecked statements.
 */
export function claimStatements(table: ClaimTable, checked = false): ClaimStatements {
  const t = table.sql;
  // The table is part of each text, so two modules sharing a pool with different tables never
  // share a name either.
  const named: Named = (role, text, parameters, companions) =>
    companions
      ? claimWithCompanions(role, text, parameters, companions)
      : {
          name: statementName(role, text, parameters),
          text,
          ...(parameters !== undefined && { parameters }),
        };
  /** `text` in the checked statements only. */
  const ifChecked = (text: string) => (checked ? text : '');
  // Sent with the COMMIT (beforeCommit): the row is this transaction's own (inserted or
  // reclaimed by it, and locked), so it always matches. Prepared with each claim that may precede
  // it, under a name of its own with each (claimWithCompanions).
  const storeResponse = checked
    ? named('store_response', `UPDATE ${t} SET response = $3 WHERE scope = $1 AND event_key = $2`)
    : undefined;
  return {
    table,
    // Checked: stores $5 (the fingerprint) with the claim, and answers a claim that was not
    // inserted with the row's fingerprint and stored response beside its status, from the same
    // statement: one row read (the LEFT JOIN), not three.
    transactionClaim: named(
      'transaction_claim',
      `
WITH bound AS (
  SELECT current_setting('lock_timeout') AS previous, set_config('lock_timeout', $4, true) AS applied,
         ${DURABLE_COMMIT} AS durable
), claim AS (
  INSERT INTO ${t} (scope, event_key, source, status, completed_at${ifChecked(', fingerprint')})
  SELECT $1, $2, $3, 'done', now()${ifChecked(', $5')} FROM bound
  ON CONFLICT (scope, event_key) DO NOTHING
  RETURNING (SELECT set_config('lock_timeout', previous, true) FROM bound) AS lock_timeout
)
${
  checked
    ? `SELECT EXISTS (SELECT 1 FROM claim) AS claimed, found.status, found.fingerprint, found.response,
       (SELECT previous FROM bound) AS previous
FROM (SELECT 1) AS one
LEFT JOIN ${t} AS found
  ON found.scope = $1 AND found.event_key = $2 AND NOT EXISTS (SELECT 1 FROM claim)`
    : `SELECT EXISTS (SELECT 1 FROM claim) AS claimed,
       CASE WHEN EXISTS (SELECT 1 FROM claim) THEN NULL
            ELSE (SELECT status FROM ${t} WHERE scope = $1 AND event_key = $2) END AS status,
       (SELECT previous FROM bound) AS previous`
}`,
      undefined,
      storeResponse && [{ role: 'store_response', statement: storeResponse }],
    ),
    // Checked: takes the new delivery's fingerprint ($5) and forgets any response: the claim is
    // this delivery's now.
    transactionReclaim: named(
      'transaction_reclaim',
      `
WITH bound AS (SELECT set_config('lock_timeout', $3, true) AS applied)
UPDATE ${t} AS pe SET
  status = 'done',
  attempts = pe.attempts + 1,
  lease_token = NULL,
  claimed_at = now(),
  lease_expires_at = NULL,
  completed_at = now(),
  last_error = NULL${ifChecked(`,
  fingerprint = $5,
  response = NULL`)}
FROM bound
WHERE pe.scope = $1 AND pe.event_key = $2
  AND (pe.status = 'failed' OR (pe.status = 'in_progress' AND pe.lease_expires_at <= now()))
RETURNING set_config('lock_timeout', $4, true) AS lock_timeout`,
    ),
    // Checked: a failure keeps the fingerprint ($6) of the delivery that failed, so that its
    // retry with another payload is told apart.
    transactionFailure: named(
      'transaction_failure',
      `
WITH bound AS (SELECT set_config('lock_timeout', $5, true) AS applied)
INSERT INTO ${t} AS pe (scope, event_key, source, status, attempts, last_error${ifChecked(', fingerprint')})
SELECT $1, $2, $3, 'failed', 1, $4${ifChecked(', $6')} FROM bound
ON CONFLICT (scope, event_key) DO UPDATE SET
  attempts = pe.attempts + 1,
  claimed_at = now(),
  last_error = EXCLUDED.last_error${ifChecked(`,
  fingerprint = EXCLUDED.fingerprint`)}
WHERE pe.status = 'failed'`,
    ),
    // Checked: $7 the fingerprint. With $8 true (conflicts refused), a failed claim or an expired
    // lease of another fingerprint is not taken over: nothing is claimed, claimState shows why,
    // and the delivery is refused without running.
    leaseClaim: named(
      'lease_claim',
      `
WITH bound AS (SELECT set_config('lock_timeout', $6, true) AS applied)
INSERT INTO ${t} AS pe
  (scope, event_key, source, status, attempts, lease_token, claimed_at, lease_expires_at${ifChecked(', fingerprint')})
SELECT $1, $2, $3, 'in_progress', 1, $4, now(), now() + $5::double precision * interval '1 millisecond'${ifChecked(', $7')}
FROM bound
ON CONFLICT (scope, event_key) DO UPDATE SET
  status = 'in_progress',
  attempts = CASE WHEN pe.lease_token = EXCLUDED.lease_token THEN pe.attempts ELSE pe.attempts + 1 END,
  lease_token = EXCLUDED.lease_token,
  claimed_at = EXCLUDED.claimed_at,
  lease_expires_at = EXCLUDED.lease_expires_at,
  completed_at = NULL,
  last_error = NULL${ifChecked(`,
  fingerprint = EXCLUDED.fingerprint,
  response = NULL`)}
${
  checked
    ? `WHERE ((pe.status = 'in_progress' AND pe.lease_expires_at <= EXCLUDED.claimed_at)
   OR pe.status = 'failed'
   OR (pe.status = 'in_progress' AND pe.lease_token = EXCLUDED.lease_token))
  AND (NOT $8::boolean OR pe.lease_token = EXCLUDED.lease_token OR pe.fingerprint IS NULL
       OR EXCLUDED.fingerprint IS NULL OR pe.fingerprint = EXCLUDED.fingerprint)`
    : `WHERE (pe.status = 'in_progress' AND pe.lease_expires_at <= EXCLUDED.claimed_at)
   OR pe.status = 'failed'
   OR (pe.status = 'in_progress' AND pe.lease_token = EXCLUDED.lease_token)`
}
RETURNING true AS claimed, pe.attempts`,
    ),
    claimState: named(
      'claim_state',
      `
SELECT status, attempts, lease_token, lease_expires_at > now() AS live,
       GREATEST(1, CEIL(EXTRACT(EPOCH FROM (lease_expires_at - now()))))::int AS seconds_left,
       GREATEST(0, EXTRACT(EPOCH FROM (now() - claimed_at)) * 1000)::double precision AS held_ms${ifChecked(`,
       fingerprint, response`)}
FROM ${t} WHERE scope = $1 AND event_key = $2`,
    ),
    // Checked: the fenced completion writes the response ($4) in the same UPDATE: the claim is
    // never done without it, and no response exists for a claim that is not done.
    leaseComplete: named(
      'lease_complete',
      `
WITH durable AS (SELECT ${DURABLE_COMMIT} AS applied)
UPDATE ${t} SET status = 'done', completed_at = now()${ifChecked(', response = $4')}
FROM durable
WHERE scope = $1 AND event_key = $2 AND lease_token = $3 AND status = 'in_progress'`,
    ),
    leaseFail: named(
      'lease_fail',
      `
UPDATE ${t} SET status = 'failed', last_error = $4
WHERE scope = $1 AND event_key = $2 AND lease_token = $3 AND status = 'in_progress'`,
    ),
    leaseRefuse: named(
      'lease_refuse',
      `
DELETE FROM ${t}
WHERE scope = $1 AND event_key = $2 AND lease_token = $3 AND status = 'in_progress'`,
    ),
    leaseExtend: named(
      'lease_extend',
      `
UPDATE ${t} SET lease_expires_at = now() + $4::double precision * interval '1 millisecond'
WHERE scope = $1 AND event_key = $2 AND lease_token = $3 AND status = 'in_progress'`,
    ),
    expireLease: named(
      'expire_lease',
      `
UPDATE ${t} SET lease_expires_at = now()
WHERE scope = $1 AND event_key = $2 AND status = 'in_progress'`,
    ),
    currentAttempt: named('current_attempt', `SELECT attempts FROM ${t} WHERE scope = $1 AND event_key = $2`),
    restoreLockTimeout: named('restore_lock_timeout', `SELECT set_config('lock_timeout', $1, true)`),
    ...(storeResponse && { storeResponse, ...claimAtCommitStatements(t, named, storeResponse) }),
  };
}

/**
 * The advisory lock of a key claimed at its COMMIT: the two-int form, whose locks never meet the
 * one-bigint form's (pg-boss's, most applications'); the first int names the table, the second is
 * the key's hash. Two keys that share a hash only wait for each other.
 */
function keyLock(table: string): string {
  const space = createHash('sha256').update(`idempotency claim at commit ${table}`).digest().readInt32BE(0);
  return `${space}, hashtext($1 || chr(10) || $2)`;
}

/** claimAtCommit and the two statements that go with it (see ClaimStatements). */
function claimAtCommitStatements(
  t: string,
  named: Named,
  storeResponse: ClaimStatement,
): Pick<ClaimStatements, 'claimAtCommit' | 'claimAtCommitWait' | 'claimAtCommitInsert'> {
  const insert = named(
    'claim_at_commit_insert',
    `
INSERT INTO ${t} (scope, event_key, source, status, completed_at, fingerprint, response)
VALUES ($1, $2, $3, 'done', now(), $4, $5)`,
  );
  return {
    claimAtCommit: named(
      'claim_at_commit',
      `
WITH bound AS (
  SELECT current_setting('lock_timeout') AS previous, ${DURABLE_COMMIT} AS durable,
         pg_try_advisory_xact_lock(${keyLock(t)}) AS locked
)
SELECT bound.locked AND found.status IS NULL AS claimed, bound.locked, found.status, found.fingerprint,
       found.response, bound.previous
FROM bound
LEFT JOIN ${t} AS found ON found.scope = $1 AND found.event_key = $2`,
      // Its scope and key alone: the claim's other values go with the insert at COMMIT.
      2,
      // Prepared with the claim, so the COMMIT can EXECUTE them on whatever session the claim met:
      // prepared there by the COMMIT itself, a PREPARE behind a pooler could meet one that already
      // has it (42P05) and an EXECUTE one that does not (26000), and the handler would run again.
      // The response is stored by an UPDATE where the claim reclaims a failed row.
      [
        { role: 'claim_at_commit_insert', statement: insert },
        { role: 'store_response', statement: storeResponse },
      ],
    ),
    claimAtCommitWait: named(
      'claim_at_commit_wait',
      `
WITH bound AS (SELECT set_config('lock_timeout', $3, true) AS applied),
locked AS (SELECT pg_advisory_xact_lock(${keyLock(t)}) AS taken FROM bound)
SELECT set_config('lock_timeout', $4, true) AS lock_timeout,
       current_setting('transaction_isolation') = 'read committed' AS fresh_snapshots
FROM locked`,
    ),
    claimAtCommitInsert: insert,
  };
}

/**
 * The transaction claim as a SQL-level prepared statement, so that BEGIN and the claim can travel
 * in one simple-protocol query (`claimAfterSql`). Prepared once per connection.
 */
export function prepareTransactionClaimSql(statements: ClaimStatements, parameters = 4): string {
  // The checked claim takes the fingerprint as a fifth text.
  return prepareClaimSql(statements.transactionClaim, Array<string>(parameters).fill('text')).join('; ');
}

/**
 * PREPARE of `claim` (the transaction claim, or a variant that does more: ordered-claim.sql.ts),
 * its companions first: a session that has the claim has them (ClaimStatement.companions). Those
 * named in `there` (what the session was just seen to have, claimOnSessionSql) are left out.
 */
function prepareClaimSql(
  claim: ClaimStatement,
  types: readonly string[],
  there: ReadonlySet<string> = new Set(),
): string[] {
  const parts: string[] = [];
  for (const companion of claim.companions ?? []) {
    if (!there.has(companion.name)) parts.push(`PREPARE ${companion.name} AS ${companion.text}`);
  }
  if (!there.has(claim.name)) parts.push(`PREPARE ${claim.name} (${types.join(', ')}) AS${claim.text}`);
  return parts;
}

/**
 * The claim on a session whose prepared statements were just read, inside the transaction (so
 * on the same session, even behind a pooler): what of the claim and its companions is not in
 * `there` is PREPAREd, companions first, and the claim EXECUTEd. After a miss, a round guessing
 * from the error could not tell a session holding the claim from one holding only its companions
 * (left by a PREPARE round that failed part-way), which no guess ever corrects.
 */
export function claimOnSessionSql(
  literals: readonly string[],
  claim: ClaimStatement,
  there: ReadonlySet<string>,
  types?: readonly string[],
): string {
  const prepare = prepareClaimSql(claim, types ?? Array<string>(literals.length).fill('text'), there);
  return [...prepare, `EXECUTE ${claim.name} (${literals.join(', ')})`].join('; ');
}

/**
 * `head` (BEGIN, or a SAVEPOINT inside the transaction) and the transaction claim as one
 * simple-protocol query: one round trip. Prepared, it is `EXECUTE` of the SQL-level prepared
 * statement (preceded by its PREPARE on a connection that has not run it); unprepared (behind a
 * transaction-mode pooler, where the next transaction may run on a server connection that never
 * saw the PREPARE), the claim's own text with the values inlined. The simple protocol takes no
 * parameters, so the values come as literals, quoted as pg's `escapeLiteral` quotes them
 * (inline-parameters.ts's literal()).
 * `claim` and `types` stand for a statement that claims and does more in the same query (the
 * ordering guard's: ordered-claim.sql.ts); it takes the claim's values first, then its own.
 */
export function claimAfterSql(
  statements: ClaimStatements,
  head: string,
  literals: readonly string[],
  how: 'execute' | 'prepare-and-execute' | 'inline',
  claim: ClaimStatement = statements.transactionClaim,
  /** The parameters' types for PREPARE; by default each a text (the claim's, and a fingerprint). */
  types?: readonly string[],
): string {
  const { name, text } = claim;
  if (how === 'inline')
    return `${head};${text.replace(/\$(\d)/g, (_, n: string) => literals[Number(n) - 1])}`;
  const execute = `EXECUTE ${name} (${literals.join(', ')})`;
  if (how === 'execute') return `${head}; ${execute}`;
  const prepare = prepareClaimSql(claim, types ?? Array<string>(literals.length).fill('text'));
  return `${head}; ${prepare.join('; ')}; ${execute}`;
}
