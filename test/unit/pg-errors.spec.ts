import { afterEach, describe, expect, it } from '@jest/globals';
import { createServer, type Server, type Socket } from 'node:net';
import { Readable } from 'node:stream';
import pg from 'pg';
import { parse, type DatabaseError } from 'pg-protocol';
import { ConnectionIsNotSetError, QueryFailedError, QueryRunnerAlreadyReleasedError } from 'typeorm';
import {
  errorCode,
  errorMessage,
  isConnectionError,
  isDataError,
  isRetryable,
  isDuplicateKey,
} from '../../lib/postgres/pg-errors.js';

/**
 * Errors are built by the libraries that build them in production: SQLSTATE errors by pg-protocol's
 * parser from ErrorResponse bytes as a server sends them (so every field lands where pg puts it),
 * TypeORM's by its own classes, socket and pool errors by pg failing against loopback sockets.
 * No database: the sockets below speak just enough of the protocol to make pg fail.
 */

/** ErrorResponse fields by their one-letter protocol code (S severity, C SQLSTATE, M message, ...). */
type ErrorFields = Record<string, string>;

/** An ErrorResponse message ('E'), as a PostgreSQL server writes it on the wire. */
function errorResponse(fields: ErrorFields): Buffer {
  const body = Buffer.concat([
    ...Object.entries(fields).map(([code, value]) => Buffer.from(`${code}${value}\0`, 'utf8')),
    Buffer.from([0]),
  ]);
  const header = Buffer.alloc(5);
  header.write('E', 0, 'ascii');
  header.writeInt32BE(body.length + 4, 1);
  return Buffer.concat([header, body]);
}

/** The DatabaseError pg's parser makes of that message: exactly what a failed query rejects with. */
async function serverError(
  code: string,
  message: string,
  severity = 'ERROR',
  more: ErrorFields = {},
): Promise<DatabaseError> {
  const messages: unknown[] = [];
  const fields = { S: severity, V: severity, C: code, M: message, ...more };
  await parse(Readable.from([errorResponse(fields)]), (parsed) => messages.push(parsed));
  expect(messages).toHaveLength(1);
  const error = messages[0] as DatabaseError;
  expect(error).toBeInstanceOf(pg.DatabaseError);
  return error;
}

/** What TypeORM's PostgresQueryRunner throws for that error. */
const queryFailed = (error: Error) => new QueryFailedError('SELECT 1', [], error);

/** Loopback servers a test opened, closed after it. */
const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
});

/** A loopback TCP server treating each connection with `onSocket`; resolves with its port. */
async function loopbackServer(onSocket: (socket: Socket) => void): Promise<number> {
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => undefined);
    onSocket(socket);
  });
  // close() waits for open connections; a held socket must not keep the test waiting.
  const close = server.close.bind(server);
  server.close = ((callback?: (error?: Error) => void) => {
    for (const socket of sockets) socket.destroy();
    return close(callback);
  }) as Server['close'];
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as { port: number }).port;
}

/** What `new pg.Client(...).connect()` rejects with against the server on `port`. */
async function connectFailure(port: number): Promise<Error> {
  const client = new pg.Client({ host: '127.0.0.1', port, user: 'u', database: 'd', password: 'p' });
  client.on('error', () => undefined);
  const error = await client.connect().then(
    () => new Error('connect() unexpectedly succeeded'),
    (failure: Error) => failure,
  );
  await client.end().catch(() => undefined);
  return error;
}

describe('errorCode', () => {
  it('reads the SQLSTATE pg puts on `code`', async () => {
    const error = await serverError('23505', 'duplicate key value violates unique constraint "orders_pkey"');
    expect(error.code).toBe('23505');
    expect(errorCode(error)).toBe('23505');
  });

  it("reads it through TypeORM's QueryFailedError, which keeps the driver's error as driverError", async () => {
    const driverError = await serverError('55P03', 'canceling statement due to lock timeout');
    const wrapped = queryFailed(driverError);
    expect(wrapped.driverError).toBe(driverError);
    expect(errorCode(wrapped)).toBe('55P03');
    // TypeORM also copies the fields up; the driverError layer must work without that copy.
    delete (wrapped as { code?: string }).code;
    expect(errorCode(wrapped)).toBe('55P03');
  });

  it('reads it through `cause`, and through a QueryFailedError inside a cause', async () => {
    const driverError = await serverError('40001', 'could not serialize access');
    expect(errorCode(new Error('claim failed', { cause: driverError }))).toBe('40001');
    expect(errorCode(new Error('outer', { cause: queryFailed(driverError) }))).toBe('40001');
  });

  it('takes the nearest code, and gives undefined when there is none', async () => {
    const inner = await serverError('23505', 'duplicate key');
    expect(errorCode(Object.assign(new Error('x', { cause: inner }), { code: '40P01' }))).toBe('40P01');
    expect(errorCode(new Error('no code'))).toBeUndefined();
    expect(errorCode(new QueryRunnerAlreadyReleasedError())).toBeUndefined();
    for (const value of [undefined, null, 'text', 42, { code: 23505 }])
      expect(errorCode(value)).toBeUndefined();
  });
});

describe('isConnectionError', () => {
  it.each([
    ['57P01', 'terminating connection due to administrator command', 'FATAL'],
    ['57P02', 'terminating connection because of crash of another server process', 'FATAL'],
    ['57P03', 'the database system is starting up', 'FATAL'],
    ['08006', 'connection failure', 'FATAL'],
    ['08003', 'connection does not exist', 'ERROR'],
    ['53300', 'sorry, too many clients already', 'FATAL'],
    ['25P03', 'terminating connection due to idle-in-transaction timeout', 'FATAL'],
    ['25006', 'cannot execute UPDATE in a read-only transaction', 'ERROR'],
  ])(
    'is true for SQLSTATE %s (%s), bare, in a QueryFailedError and as a cause',
    async (code, message, severity) => {
      const error = await serverError(code, message, severity);
      expect(isConnectionError(error)).toBe(true);
      expect(isConnectionError(queryFailed(error))).toBe(true);
      expect(isConnectionError(new Error('claim failed', { cause: error }))).toBe(true);
    },
  );

  it.each([
    ['23505', 'duplicate key value violates unique constraint "orders_pkey"'],
    ['22P02', 'invalid input syntax for type uuid: "x"'],
    ['40001', 'could not serialize access due to concurrent update'],
    ['42P01', 'relation "processed_events" does not exist'],
    ['55P03', 'canceling statement due to lock timeout'],
    ['57014', 'canceling statement due to statement timeout'],
  ])('is false for SQLSTATE %s (%s): the statement failed, not the database', async (code, message) => {
    const error = await serverError(code, message);
    expect(isConnectionError(error)).toBe(false);
    expect(isConnectionError(queryFailed(error))).toBe(false);
    expect(isConnectionError(new Error('claim failed', { cause: error }))).toBe(false);
  });

  it('is true for a server that refuses the session at start-up: pg.connect() rejects with its FATAL 53300', async () => {
    const port = await loopbackServer((socket) =>
      socket.once('data', () =>
        socket.end(
          errorResponse({ S: 'FATAL', V: 'FATAL', C: '53300', M: 'sorry, too many clients already' }),
        ),
      ),
    );
    const error = await connectFailure(port);
    expect(error).toBeInstanceOf(pg.DatabaseError);
    expect(errorCode(error)).toBe('53300');
    expect(isConnectionError(error)).toBe(true);
  });

  it('is true for ECONNREFUSED from pg connecting to a loopback port nobody listens on', async () => {
    const port = await loopbackServer((socket) => socket.destroy());
    await new Promise((resolve) => servers.pop()!.close(resolve));
    const error = await connectFailure(port);
    expect(errorCode(error)).toBe('ECONNREFUSED');
    expect(isConnectionError(error)).toBe(true);
    expect(isConnectionError(new Error('claim failed', { cause: error }))).toBe(true);
  });

  it("is true for pg's 'Connection terminated unexpectedly' when the server hangs up", async () => {
    const port = await loopbackServer((socket) => socket.once('data', () => socket.destroy()));
    const error = await connectFailure(port);
    expect(error.message).toBe('Connection terminated unexpectedly');
    expect(errorCode(error)).toBeUndefined();
    expect(isConnectionError(error)).toBe(true);
    expect(isConnectionError(queryFailed(error))).toBe(true);
  });

  it("is true for pg-pool's two connect timeouts and for a pool used after end()", async () => {
    // Accepts and never answers. With one slot, the first query's client times out connecting;
    // the second, queued for that slot, times out waiting for it.
    const port = await loopbackServer(() => undefined);
    const pool = new pg.Pool({
      host: '127.0.0.1',
      port,
      user: 'u',
      database: 'd',
      max: 1,
      connectionTimeoutMillis: 300,
    });
    const failure = (query: Promise<unknown>) =>
      query.then(
        () => new Error('query unexpectedly succeeded'),
        (error: Error) => error,
      );
    const [connecting, queued] = await Promise.all([
      failure(pool.query('SELECT 1')),
      failure(pool.query('SELECT 1')),
    ]);
    expect(connecting.message).toBe('Connection terminated due to connection timeout');
    expect(isConnectionError(connecting)).toBe(true);
    expect(queued.message).toBe('timeout exceeded when trying to connect');
    expect(isConnectionError(queued)).toBe(true);
    await pool.end();
    const ended = await failure(pool.query('SELECT 1'));
    expect(ended.message).toBe('Cannot use a pool after calling end on the pool');
    expect(isConnectionError(ended)).toBe(true);
  });

  it("is true for TypeORM's QueryRunnerAlreadyReleasedError and ConnectionIsNotSetError", () => {
    const released = new QueryRunnerAlreadyReleasedError();
    expect(released.name).toBe('QueryRunnerAlreadyReleasedError');
    expect(isConnectionError(released)).toBe(true);
    expect(isConnectionError(new Error('commit failed', { cause: released }))).toBe(true);
    expect(isConnectionError(new ConnectionIsNotSetError('postgres'))).toBe(true);
  });

  it('is false for a handler error and for values that are not errors', () => {
    expect(isConnectionError(new Error('handler failed on purpose'))).toBe(false);
    expect(isConnectionError(new TypeError('x is undefined'))).toBe(false);
    for (const value of [undefined, null, 'Connection terminated', 0])
      expect(isConnectionError(value)).toBe(false);
  });
});

describe('isRetryable', () => {
  it.each([
    ['40001', 'could not serialize access due to concurrent update'],
    ['40P01', 'deadlock detected'],
  ])('is true for %s (%s), bare, wrapped by TypeORM and as a cause', async (code, message) => {
    const error = await serverError(code, message);
    expect(isRetryable(error)).toBe(true);
    expect(isRetryable(queryFailed(error))).toBe(true);
    expect(isRetryable(new Error('claim failed', { cause: error }))).toBe(true);
  });

  it.each([
    ['55P03', 'canceling statement due to lock timeout'],
    ['23505', 'duplicate key value'],
    ['57P01', 'terminating connection due to administrator command'],
    ['40002', 'integrity constraint violation at commit'],
  ])('is false for %s (%s)', async (code, message) => {
    expect(isRetryable(await serverError(code, message))).toBe(false);
  });

  it('is false without a code', () => {
    expect(isRetryable(new Error('Connection terminated unexpectedly'))).toBe(false);
    expect(isRetryable(undefined)).toBe(false);
  });
});

describe('isDataError', () => {
  it.each([
    ['22P02', 'invalid input syntax for type integer: "x"'],
    ['22001', 'value too long for type character varying(255)'],
    ['22021', 'invalid byte sequence for encoding "UTF8": 0x00'],
    ['23505', 'duplicate key value violates unique constraint'],
    ['23503', 'insert or update violates foreign key constraint'],
    ['23514', 'new row violates check constraint "processed_events_status_check"'],
  ])('is true for class 22/23 SQLSTATE %s (%s), bare and wrapped', async (code, message) => {
    const error = await serverError(code, message);
    expect(isDataError(error)).toBe(true);
    expect(isDataError(queryFailed(error))).toBe(true);
    expect(isDataError(new Error('outer', { cause: error }))).toBe(true);
  });

  it.each([
    ['40001', 'could not serialize access'],
    ['42P01', 'relation does not exist'],
    ['57P01', 'terminating connection due to administrator command'],
    ['08006', 'connection failure'],
  ])('is false for %s (%s)', async (code, message) => {
    expect(isDataError(await serverError(code, message))).toBe(false);
  });

  it('is false without a code', () => {
    expect(isDataError(new Error('plain'))).toBe(false);
    expect(isDataError(new QueryRunnerAlreadyReleasedError())).toBe(false);
    expect(isDataError(null)).toBe(false);
  });
});

describe('isDuplicateKey', () => {
  const KEY = 'scope, event_key';
  /** A 23505 as PostgreSQL reports it for an insert into `schema.table` (fields s, t, n, D). */
  const duplicateKey = (table: string, schema = 'public', detail?: string) =>
    serverError('23505', `duplicate key value violates unique constraint "${table}_pkey"`, 'ERROR', {
      s: schema,
      t: table,
      n: `${table}_pkey`,
      ...(detail === undefined ? {} : { D: detail }),
    });
  const claimKeyDetail = 'Key (scope, event_key)=(bench:lib-request, evt_1) already exists.';

  it('is true for a duplicate of the key its detail names, in any table, partition or language, bare and wrapped', async () => {
    const error = await duplicateKey('processed_events', 'billing', claimKeyDetail);
    expect(isDuplicateKey(error, KEY, 'processed_events')).toBe(true);
    expect(isDuplicateKey(queryFailed(error), KEY, 'processed_events')).toBe(true);
    expect(isDuplicateKey(new Error('outer', { cause: error }), KEY, 'processed_events')).toBe(true);
    // A partitioned table: PostgreSQL names the partition the row went to.
    const partition = await duplicateKey('processed_events_p3', 'public', claimKeyDetail);
    expect(isDuplicateKey(partition, KEY, 'processed_events')).toBe(true);
    // lc_messages = 'de': the words are translated, the columns are not.
    const german = await duplicateKey(
      'processed_events',
      'public',
      'Schlüssel »(scope, event_key)=(s, k)« existiert bereits.',
    );
    expect(isDuplicateKey(german, KEY, 'processed_events')).toBe(true);
  });

  it('is false for a duplicate of another unique index of the same table, another code, or no error of the database', async () => {
    const otherIndex = await duplicateKey(
      'processed_events',
      'public',
      'Key (source, fingerprint)=(s, f) already exists.',
    );
    expect(isDuplicateKey(otherIndex, KEY, 'processed_events')).toBe(false);
    const checkViolation = await serverError('23514', 'new row violates check constraint', 'ERROR', {
      t: 'processed_events',
    });
    expect(isDuplicateKey(checkViolation, KEY, 'processed_events')).toBe(false);
    expect(isDuplicateKey(new Error('plain'), KEY, 'processed_events')).toBe(false);
  });

  it('without a detail (a role that may not read the columns), goes by the table and its schema', async () => {
    expect(isDuplicateKey(await duplicateKey('processed_events'), KEY, 'processed_events')).toBe(true);
    expect(
      isDuplicateKey(await duplicateKey('processed_events', 'billing'), KEY, 'processed_events', 'billing'),
    ).toBe(true);
    expect(isDuplicateKey(await duplicateKey('orders'), KEY, 'processed_events')).toBe(false);
    expect(isDuplicateKey(await duplicateKey('processed_events'), KEY, 'processed_events', 'billing')).toBe(
      false,
    );
    expect(isDuplicateKey(await serverError('23505', 'duplicate key'), KEY, 'processed_events')).toBe(false);
  });
});

describe('errorMessage', () => {
  it("is an Error's message, or the value as text", async () => {
    expect(errorMessage(await serverError('23505', 'duplicate key'))).toBe('duplicate key');
    expect(errorMessage(queryFailed(await serverError('23505', 'duplicate key')))).toBe('duplicate key');
    expect(errorMessage('plain text')).toBe('plain text');
    expect(errorMessage(undefined)).toBe('undefined');
  });
});
