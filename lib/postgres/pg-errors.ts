/**
 * What a database error means for a delivery, decided once, here. node-postgres puts the SQLSTATE
 * on `code`; TypeORM's QueryFailedError keeps the driver's error on `driverError`; pg and
 * TypeORM signal a lost connection with errors that have no SQLSTATE at all, only a message.
 */

/** lock_timeout ran out (55P03): another delivery holds the claim. */
export const LOCK_NOT_AVAILABLE = '55P03';

/** EXECUTE of a name the connection does not have (DEALLOCATE, DISCARD, or a transaction-mode pooler). */
export const UNKNOWN_PREPARED_STATEMENT = '26000';

/** PREPARE of a name the connection already has (another module, or a pooler, got there first). */
export const DUPLICATE_PREPARED_STATEMENT = '42P05';

/**
 * A value that is not of its type's text form; also how a statement sent with the COMMIT reports
 * that it wrote nothing (ClaimTransaction.beforeCommit).
 */
export const INVALID_TEXT_REPRESENTATION = '22P02';

/**
 * A statement sent in a transaction that an earlier failed statement aborted (25P02): it did not
 * run, nor did any statement after it in the same query.
 */
export const IN_FAILED_SQL_TRANSACTION = '25P02';

/** Serialization failure or deadlock: safe to re-run the whole claim in a fresh transaction. */
const RETRYABLE_CODES = new Set(['40001', '40P01']);

/**
 * SQLSTATEs of a server that is going away or refusing sessions, beyond class 08 (connection
 * exception) and class 53 (insufficient resources, too many connections among them).
 */
const CONNECTION_CODES = new Set([
  '57P01', // admin_shutdown: pg_terminate_backend, a restart
  '57P02', // crash_shutdown
  '57P03', // cannot_connect_now: starting up or shutting down
  '25P03', // idle_in_transaction_session_timeout: the server closed the session
  // read_only_sql_transaction: a write reached a standby, as when a failover moved the database's
  // endpoint before the promotion finished. A fenced completion sent again lands once it has.
  '25006',
]);

/** Node's socket errors. */
const SOCKET_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
]);

/** pg and pg-pool errors of a lost or unavailable connection, which carry no code. */
const CONNECTION_MESSAGES =
  /Connection terminated|connection error and is not queryable|Client was closed and is not queryable|timeout exceeded when trying to connect|Cannot use a pool after calling end|Connection is not established/i;

/** TypeORM's errors of a connection it no longer has. */
const CONNECTION_ERROR_NAMES = new Set([
  'QueryRunnerAlreadyReleasedError',
  'QueryRunnerProviderAlreadyReleasedError',
  'ConnectionIsNotSetError',
]);

/** The error and what it wraps (TypeORM's driverError, an Error's cause), nearest first. */
function* layers(error: unknown): Generator<Record<string, unknown>> {
  let current = error;
  for (let depth = 0; depth < 4 && typeof current === 'object' && current !== null; depth++) {
    const layer = current as Record<string, unknown>;
    yield layer;
    current = layer.driverError ?? layer.cause;
  }
}

/** SQLSTATE (or Node error code) of a driver error, if any. */
export function errorCode(error: unknown): string | undefined {
  for (const layer of layers(error)) {
    if (typeof layer.code === 'string') return layer.code;
  }
  return undefined;
}

/** Serialization failure or deadlock: the whole claim may run again in a fresh transaction. */
export function isRetryable(error: unknown): boolean {
  return RETRYABLE_CODES.has(errorCode(error) ?? '');
}

/** SQLSTATE classes 22 (data exception) and 23 (integrity constraint violation): the data was refused. */
export function isDataError(error: unknown): boolean {
  const code = errorCode(error);
  return code !== undefined && (code.startsWith('22') || code.startsWith('23'));
}

/**
 * A unique violation (23505) of the key made of `columns` (as PostgreSQL lists them, e.g.
 * `scope, event_key`) in the table `name` (in `schema`, when one is given): a row with the same key
 * was there already. PostgreSQL's detail names the key's columns (`Key (scope, event_key)=(...)
 * already exists.`: the word Key is translated, the column names are not), whatever the constraint
 * is called and whichever partition of the table the row went to (the error's `table` is then the
 * partition's). A server that leaves the detail out (a role that may not read the columns) names
 * only the table, which is then taken as the key's.
 */
export function isDuplicateKey(error: unknown, columns: string, name: string, schema?: string): boolean {
  for (const layer of layers(error)) {
    if (typeof layer.code !== 'string') continue;
    if (layer.code !== '23505') return false;
    if (typeof layer.detail === 'string') return layer.detail.includes(`(${columns})=(`);
    return layer.table === name && (schema === undefined || layer.schema === schema);
  }
  return false;
}

/** Objects that already exist: a schema (42P06), a table (42P07), a type or function (42710). */
const DUPLICATE_OBJECT_CODES = new Set(['42P06', '42P07', '42710']);

/**
 * Two sessions created the same schema object at once. `CREATE ... IF NOT EXISTS` does not
 * serialize: the second can still fail on the catalog's own unique index (`pg_namespace_nspname_index`,
 * `pg_type_typname_nsp_index`: SQLSTATE 23505 on a constraint in `pg_catalog`), or with a
 * duplicate-object code. Running the same DDL again finds the object and passes. (pg-boss's own
 * install already swallows errors saying "already exists", so from its start() it is the 23505 that
 * gets through; the duplicate-object codes come from its migrations and from create_queue.)
 */
export function isCatalogRace(error: unknown): boolean {
  for (const layer of layers(error)) {
    const code = layer.code;
    if (typeof code !== 'string') continue;
    if (DUPLICATE_OBJECT_CODES.has(code)) return true;
    return code === '23505' && layer.schema === 'pg_catalog';
  }
  return false;
}

/**
 * The database, not the statement, failed: the connection was lost or refused, the server is
 * shutting down or out of connections, or the pool gave up waiting. The delivery can succeed
 * later unchanged, so it is answered 503 + Retry-After rather than as a handler failure.
 */
export function isConnectionError(error: unknown): boolean {
  for (const layer of layers(error)) {
    const code = layer.code;
    if (typeof code === 'string') {
      if (code.startsWith('08') || code.startsWith('53') || CONNECTION_CODES.has(code)) return true;
      if (SOCKET_CODES.has(code)) return true;
    }
    if (typeof layer.name === 'string' && CONNECTION_ERROR_NAMES.has(layer.name)) return true;
    if (typeof layer.message === 'string' && CONNECTION_MESSAGES.test(layer.message)) return true;
  }
  return false;
}

/** The error's message, for logs and `last_error`. */
export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
