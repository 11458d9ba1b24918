import { createServer, connect, type Server, type Socket } from 'node:net';

/**
 * A loopback TCP proxy in front of PostgreSQL for fault injection: point an app's DataSource at
 * `proxy.url(db.url)` and cut one of its connections at the moment a chosen statement goes by.
 *
 * The proxy reads the PostgreSQL frontend protocol (v3) the client sends, message by message:
 * a simple Query (`'Q'` + int32 length + SQL text + `\0`), and the extended protocol's Parse
 * (`'P'`: statement name, SQL text) and Bind (`'B'`: portal, statement name, parameters). Each
 * execution (a Query, or a Bind of a parsed statement) is matched against the armed rules with
 * its SQL text (for a Bind, the text its statement was parsed with on that connection, however
 * long ago: pg parses a named statement once per connection and only binds it afterwards).
 *
 * - `'before-forward'`: the statement never reaches the server. Both sockets are destroyed at
 *   once; the client's query fails with a lost connection, and the server rolls back whatever
 *   transaction the connection had open: nothing ran.
 * - `'after-forward'`: the statement (and, for the extended protocol, everything up to its Sync)
 *   reaches the server; the proxy withholds the server's answer, waits until the server has
 *   finished with it (its ReadyForQuery), and only then destroys both sockets. The server ran
 *   it, and is done with it, by the time the client learns its connection is gone: an ambiguous
 *   COMMIT, or a fenced UPDATE that happened although its caller never heard so.
 *
 * `holdStartup()` withholds the next connection's startup ReadyForQuery until the server sends
 * something more (its FATAL, once the test terminated that backend), then forwards both in one
 * write: the client reads a session that starts and dies in one chunk.
 *
 * Plain TCP only (no TLS: an SSLRequest is passed through, but a TLS stream cannot be read), and
 * loopback only. Every connection it accepted is destroyed by `close()`.
 *
 * ```ts
 * const proxy = await startTcpProxy(pgHost, pgPort);
 * const app = await startApp(adapter, [WebhookFixtureModule.forDatabase({ databaseUrl: proxy.url(db.url) })]);
 * const cut = proxy.cutWhen((sql) => sql === 'COMMIT', { when: 'after-forward' });
 * // ... deliver; the COMMIT commits, the app's connection is cut before it hears so
 * await cut.done;
 * ```
 */
export interface TcpProxy {
  /** The loopback port the proxy listens on. */
  readonly port: number;
  /** `databaseUrl` (a URL of the proxied server) with its host and port replaced by the proxy's. */
  url(databaseUrl: string): string;
  /**
   * Arms a one-shot rule: the first execution for which `predicate` returns true, on any
   * connection, cuts that connection (`options.when`, default `'before-forward'`). Rules are
   * tried in the order they were armed.
   */
  cutWhen(predicate: StatementPredicate, options?: CutOptions): CutRule;
  /**
   * Arms a one-shot hold on the next connection the proxy accepts: the server's ReadyForQuery
   * that ends its startup is withheld from the client until the server sends anything more, and
   * then forwarded together with it, in one write. Terminate `backendPid` meanwhile and the
   * client reads its session's ReadyForQuery and FATAL in the same read, as when a backend is
   * terminated (or a server shuts down) just as a session starts.
   */
  holdStartup(): StartupHold;
  /** Every cut made so far, in order. */
  readonly cuts: readonly CutRecord[];
  /**
   * Every execution that reached the server, in order, on every connection; a statement cut
   * `'before-forward'` is not among them. Counts what an app really sent (e.g. claim statements).
   */
  readonly statements: readonly ClientStatement[];
  /** Connections currently open through the proxy. */
  readonly openConnections: number;
  /** Stops listening and destroys every connection. */
  close(): Promise<void>;
}

/** One execution a client sent: a simple Query, or a Bind of a parsed statement. */
export interface ClientStatement {
  /** Which proxied connection sent it (1 for the first one accepted). */
  readonly connection: number;
  /** `'query'`: a simple-protocol Query; `'bind'`: an extended-protocol Bind (one execution). */
  readonly kind: 'query' | 'bind';
  /** The SQL text (a simple Query may hold several statements separated by `;`). */
  readonly text: string;
  /** The prepared statement's name for a Bind (`''` for the unnamed one); `''` for a Query. */
  readonly statementName: string;
  /** Text-format parameter values of a Bind (null for SQL NULL or a binary value); `[]` for a Query. */
  readonly parameters: readonly (string | null)[];
}

/** Decides, from its SQL text (and the rest of the execution), whether a statement triggers a cut. */
export type StatementPredicate = (sql: string, statement: ClientStatement) => boolean;

/** When a rule cuts, relative to its statement. */
export type CutMoment = 'before-forward' | 'after-forward';

/** Options of `cutWhen`. */
export interface CutOptions {
  /** @default 'before-forward' */
  when?: CutMoment;
}

/** A cut that happened. */
export interface CutRecord {
  readonly statement: ClientStatement;
  readonly when: CutMoment;
}

/** An armed rule. */
export interface CutRule {
  /**
   * Resolves once the cut is complete: both sockets destroyed (for `'after-forward'`, after the
   * server finished with the statement).
   */
  readonly done: Promise<CutRecord>;
  /** True once the rule has matched a statement (its cut may still be completing). */
  readonly fired: boolean;
  /** Disarms the rule if it has not fired. */
  cancel(): void;
}

/** An armed startup hold. */
export interface StartupHold {
  /** The held session's backend pid (from its BackendKeyData), once its ReadyForQuery is held. */
  readonly backendPid: Promise<number>;
}

interface ArmedRule {
  predicate: StatementPredicate;
  when: CutMoment;
  fired: boolean;
  cancelled: boolean;
  resolve(record: CutRecord): void;
}

/** Protocol 3.0 in a StartupMessage; the other untyped requests keep the stream in its startup phase. */
const PROTOCOL_3 = 196608;
const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;

/**
 * Starts a proxy on a free loopback port that forwards every connection to
 * `targetHost:targetPort` (a PostgreSQL server).
 */
export async function startTcpProxy(targetHost: string, targetPort: number): Promise<TcpProxy> {
  const rules: ArmedRule[] = [];
  const cuts: CutRecord[] = [];
  const statements: ClientStatement[] = [];
  const open = new Set<ProxiedConnection>();
  let nextConnection = 1;
  /** The armed startup hold, taken by the next connection accepted. */
  let startupHold: ((pid: number) => void) | undefined;

  /** The first armed rule `statement` matches, now fired; undefined when none does. */
  const match = (statement: ClientStatement): ArmedRule | undefined => {
    for (const rule of rules) {
      if (rule.fired || rule.cancelled) continue;
      if (rule.predicate(statement.text, statement)) {
        rule.fired = true;
        return rule;
      }
    }
    return undefined;
  };

  const server: Server = createServer((client) => {
    const hold = startupHold;
    startupHold = undefined;
    const connection = new ProxiedConnection(nextConnection++, client, connect(targetPort, targetHost), {
      match,
      forwarded: (statement) => statements.push(statement),
      cut: (rule, record) => {
        cuts.push(record);
        rule.resolve(record);
      },
      closed: () => open.delete(connection),
      startupHeld: hold,
    });
    open.add(connection);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as { port: number }).port;

  return {
    port,
    url(databaseUrl) {
      const url = new URL(databaseUrl);
      url.hostname = '127.0.0.1';
      url.port = String(port);
      return url.toString();
    },
    cutWhen(predicate, options = {}) {
      let resolve!: (record: CutRecord) => void;
      const done = new Promise<CutRecord>((settle) => (resolve = settle));
      const rule: ArmedRule = {
        predicate,
        when: options.when ?? 'before-forward',
        fired: false,
        cancelled: false,
        resolve,
      };
      rules.push(rule);
      return {
        done,
        get fired() {
          return rule.fired;
        },
        cancel() {
          rule.cancelled = true;
        },
      };
    },
    holdStartup() {
      return { backendPid: new Promise<number>((resolve) => (startupHold = resolve)) };
    },
    cuts,
    statements,
    get openConnections() {
      return open.size;
    },
    async close() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const connection of open) connection.destroy();
      await closed;
    },
  };
}

/** What a connection asks of its proxy. */
interface ConnectionHooks {
  match(statement: ClientStatement): ArmedRule | undefined;
  forwarded(statement: ClientStatement): void;
  cut(rule: ArmedRule, record: CutRecord): void;
  closed(): void;
  /** Set when this connection took an armed startup hold: called with its backend pid once held. */
  startupHeld?: (pid: number) => void;
}

/** A cut under way with `'after-forward'`: waiting for the server to finish the statement. */
interface PendingCut {
  rule: ArmedRule;
  record: CutRecord;
  /** The ReadyForQuery count at which the server is done with the statement. */
  readyTarget: number;
  /** Extended protocol: client messages still go through until the statement's Sync. */
  awaitingSync: boolean;
}

/** One client connection and its server connection, with both byte streams read as messages. */
class ProxiedConnection {
  private fromClient = Buffer.alloc(0);
  private fromServer = Buffer.alloc(0);
  /** Before the StartupMessage, client messages have no type byte. */
  private startup = true;
  /** Single-byte server answers still owed to SSLRequest/GSSENCRequest messages. */
  private singleByteAnswers = 0;
  /** Statement texts by name, from this connection's Parse messages. */
  private readonly parsed = new Map<string, string>();
  /** Queries and Syncs sent (and the startup), each answered by one ReadyForQuery. */
  private syncPoints = 0;
  /** ReadyForQuery messages the server sent. */
  private ready = 0;
  private pending?: PendingCut;
  private destroyed = false;
  /** The session's backend pid, from its BackendKeyData. */
  private backendPid = 0;
  /** startupHeld: the startup ReadyForQuery, withheld until the server sends more. */
  private heldStartup?: Buffer;
  /** After a held startup went out: a closing server ends the client gently, so it reads it all. */
  private endGently = false;

  constructor(
    private readonly id: number,
    private readonly client: Socket,
    private readonly server: Socket,
    private readonly hooks: ConnectionHooks,
  ) {
    client.on('data', (chunk: Buffer) => this.onClientData(chunk));
    server.on('data', (chunk: Buffer) => this.onServerData(chunk));
    // Either side going away takes the other with it, as a plain TCP proxy would.
    for (const socket of [client, server]) {
      socket.on('error', () => this.destroy());
      socket.on('close', () => this.destroy());
    }
  }

  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    if (this.endGently) this.client.end();
    else this.client.destroy();
    this.server.destroy();
    this.hooks.closed();
  }

  private onClientData(chunk: Buffer): void {
    this.fromClient = Buffer.concat([this.fromClient, chunk]);
    const forward: Buffer[] = [];
    for (;;) {
      const message = this.nextClientMessage();
      if (!message) break;
      if (this.destroyed) return;
      if (this.pending && !this.pending.awaitingSync) continue; // after the cut statement: dropped
      const decision = this.decide(message);
      if (decision === 'drop-and-cut') {
        // before-forward: what came before the statement goes on, the statement does not.
        this.send(this.server, forward);
        return this.destroy();
      }
      forward.push(message.bytes);
    }
    this.send(this.server, forward);
  }

  /** Whether `message` goes to the server, and the bookkeeping of sync points and rules. */
  private decide(message: ClientMessage): 'forward' | 'drop-and-cut' {
    const { type, body } = message;
    if (type === 'Q' || type === 'S' || type === 'startup') this.syncPoints++;
    if (this.pending?.awaitingSync) {
      if (type === 'S' || type === 'Q') {
        this.pending.awaitingSync = false;
        this.pending.readyTarget = this.syncPoints;
      }
      return 'forward';
    }
    if (type === 'P') {
      const name = cString(body, 0);
      this.parsed.set(name.value, cString(body, name.end).value);
      return 'forward';
    }
    if (type === 'C' && body[0] === 0x53 /* 'S': a statement */) {
      this.parsed.delete(cString(body, 1).value);
      return 'forward';
    }
    if (type !== 'Q' && type !== 'B') return 'forward';

    const statement = type === 'Q' ? this.query(body) : this.bind(body);
    const rule = this.hooks.match(statement);
    if (!rule) {
      this.hooks.forwarded(statement);
      return 'forward';
    }
    const record: CutRecord = { statement, when: rule.when };
    if (rule.when === 'before-forward') {
      this.syncPoints--; // it never reaches the server
      this.hooks.cut(rule, record);
      return 'drop-and-cut';
    }
    this.hooks.forwarded(statement);
    this.pending = { rule, record, readyTarget: this.syncPoints, awaitingSync: type === 'B' };
    return 'forward';
  }

  private query(body: Buffer): ClientStatement {
    return {
      connection: this.id,
      kind: 'query',
      text: cString(body, 0).value,
      statementName: '',
      parameters: [],
    };
  }

  private bind(body: Buffer): ClientStatement {
    const portal = cString(body, 0);
    const name = cString(body, portal.end);
    let offset = name.end;
    const formatCount = body.readInt16BE(offset);
    offset += 2;
    const formats: number[] = [];
    for (let i = 0; i < formatCount; i++, offset += 2) formats.push(body.readInt16BE(offset));
    const parameterCount = body.readInt16BE(offset);
    offset += 2;
    const parameters: (string | null)[] = [];
    for (let i = 0; i < parameterCount; i++) {
      const length = body.readInt32BE(offset);
      offset += 4;
      const format = formatCount === 0 ? 0 : formatCount === 1 ? formats[0] : formats[i];
      if (length < 0) {
        parameters.push(null);
        continue;
      }
      parameters.push(format === 0 ? body.toString('utf8', offset, offset + length) : null);
      offset += length;
    }
    return {
      connection: this.id,
      kind: 'bind',
      text: this.parsed.get(name.value) ?? '',
      statementName: name.value,
      parameters,
    };
  }

  private onServerData(chunk: Buffer): void {
    this.fromServer = Buffer.concat([this.fromServer, chunk]);
    const forward: Buffer[] = [];
    for (;;) {
      const message = this.nextServerMessage();
      if (!message) break;
      if (this.holdsStartup(message, forward)) continue;
      const pending = this.pending;
      // Answers to what the client sent before the cut statement still reach it; the answer to
      // the cut statement (and anything after) does not.
      const answersCutStatement = pending !== undefined && this.ready >= pending.readyTarget - 1;
      if (!answersCutStatement) forward.push(message.bytes);
      if (message.type === 'Z') this.ready++;
      if (pending && !pending.awaitingSync && this.ready >= pending.readyTarget) {
        this.send(this.client, forward);
        this.hooks.cut(pending.rule, pending.record);
        return this.destroy();
      }
    }
    this.send(this.client, forward);
  }

  /**
   * holdStartup(): withholds the startup's ReadyForQuery, and puts it in front of the next server
   * message. True when `message` was taken (held, or already queued in `forward`).
   */
  private holdsStartup(message: { type: string; bytes: Buffer }, forward: Buffer[]): boolean {
    const held = this.hooks.startupHeld;
    if (!held) return false;
    if (message.type === 'K') this.backendPid = message.bytes.readInt32BE(5);
    if (this.heldStartup) {
      forward.push(this.heldStartup, message.bytes);
      this.heldStartup = undefined;
      this.hooks.startupHeld = undefined;
      this.endGently = true;
      this.ready++;
      return true;
    }
    if (message.type !== 'Z' || this.ready > 0) return false;
    this.heldStartup = message.bytes;
    held(this.backendPid);
    return true;
  }

  private send(socket: Socket, messages: Buffer[]): void {
    if (messages.length > 0 && !this.destroyed) socket.write(Buffer.concat(messages));
    messages.length = 0;
  }

  /** The next whole client message, or undefined until more bytes arrive. */
  private nextClientMessage(): ClientMessage | undefined {
    const buffer = this.fromClient;
    if (this.startup) {
      if (buffer.length < 8) return undefined;
      const length = buffer.readInt32BE(0);
      if (buffer.length < length) return undefined;
      const code = buffer.readInt32BE(4);
      if (code === PROTOCOL_3) this.startup = false;
      if (code === SSL_REQUEST || code === GSSENC_REQUEST) this.singleByteAnswers++;
      this.fromClient = buffer.subarray(length);
      const bytes = buffer.subarray(0, length);
      // Only the StartupMessage is answered with a ReadyForQuery (after authentication).
      return { type: code === PROTOCOL_3 ? 'startup' : 'request', body: bytes.subarray(8), bytes };
    }
    if (buffer.length < 5) return undefined;
    const length = buffer.readInt32BE(1);
    if (buffer.length < 1 + length) return undefined;
    const bytes = buffer.subarray(0, 1 + length);
    this.fromClient = buffer.subarray(1 + length);
    return { type: String.fromCharCode(bytes[0]), body: bytes.subarray(5), bytes };
  }

  /** The next whole server message, or undefined until more bytes arrive. */
  private nextServerMessage(): { type: string; bytes: Buffer } | undefined {
    const buffer = this.fromServer;
    if (this.singleByteAnswers > 0) {
      if (buffer.length < 1) return undefined;
      this.singleByteAnswers--;
      this.fromServer = buffer.subarray(1);
      return { type: 'answer', bytes: buffer.subarray(0, 1) };
    }
    if (buffer.length < 5) return undefined;
    const length = buffer.readInt32BE(1);
    if (buffer.length < 1 + length) return undefined;
    this.fromServer = buffer.subarray(1 + length);
    return { type: String.fromCharCode(buffer[0]), bytes: buffer.subarray(0, 1 + length) };
  }
}

/** A client message: its type byte ('startup'/'request' for the untyped ones), body and all its bytes. */
interface ClientMessage {
  type: string;
  body: Buffer;
  bytes: Buffer;
}

/** The NUL-terminated string at `offset`, and the offset after its NUL. */
function cString(buffer: Buffer, offset: number): { value: string; end: number } {
  const nul = buffer.indexOf(0, offset);
  const end = nul === -1 ? buffer.length : nul;
  return { value: buffer.toString('utf8', offset, end), end: end + 1 };
}
