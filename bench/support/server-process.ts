import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { TracedQuery } from '../server/query-counter.js';
import type { AsyncCounts } from '../server/async-counter.js';
import type { ServerCommand, ServerReady, ServerReply, ServerStats } from './server-protocol.js';

const SERVER_ENTRY = fileURLToPath(new URL('../server/main.js', import.meta.url));
/** Lines of server output kept for the report (errors and warnings only; it logs nothing else). */
const KEPT_LOG_LINES = 40;

/** Settings of the server process. */
export interface ServerProcessOptions {
  adapter: 'express' | 'fastify';
  databaseUrl: string;
  poolSize: number;
  duplicateWaitMs?: number;
  /** The library's `preparedStatements` (undefined: its default). */
  preparedStatements?: boolean | 'auto';
  /** Another checkout's compiled bench/server/main.js (`--baseline`); this checkout's by default. */
  entry?: string;
}

/** The last lines a process printed, and how many it printed in all. */
class TailLog {
  readonly lines: string[] = [];
  count = 0;

  readonly append = (chunk: Buffer): void => {
    for (const line of chunk.toString().split('\n').filter(Boolean)) {
      this.count++;
      this.lines.push(line);
      if (this.lines.length > KEPT_LOG_LINES) this.lines.shift();
    }
  };
}

/** The bench server, in its own process, driven over the IPC channel. */
export class ServerProcess {
  private nextId = 1;
  private readonly pending = new Map<number, (reply: ServerReply) => void>();

  private constructor(
    private readonly child: ChildProcess,
    readonly url: string,
    /** Server output: errors and warnings only (it logs nothing else). */
    readonly log: TailLog,
  ) {
    child.on('message', (message: ServerReply) => {
      this.pending.get(message.id)?.(message);
      this.pending.delete(message.id);
    });
    // A server that dies mid-run fails the run instead of leaving it waiting for a reply.
    child.on('exit', (code, signal) => {
      for (const [id, settle] of this.pending)
        settle({ id, error: `bench server exited (${code ?? signal})` });
      this.pending.clear();
    });
  }

  static async start(options: ServerProcessOptions): Promise<ServerProcess> {
    const child = fork(options.entry ?? SERVER_ENTRY, [], {
      env: {
        ...process.env,
        BENCH_DATABASE_URL: options.databaseUrl,
        BENCH_ADAPTER: options.adapter,
        BENCH_POOL_SIZE: String(options.poolSize),
        BENCH_DUPLICATE_WAIT_MS: options.duplicateWaitMs === undefined ? '' : String(options.duplicateWaitMs),
        BENCH_PREPARED_STATEMENTS:
          options.preparedStatements === undefined ? '' : String(options.preparedStatements),
        NODE_ENV: 'production',
      },
      stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    });
    const log = new TailLog();
    child.stdout?.on('data', log.append);
    child.stderr?.on('data', log.append);
    const url = await new Promise<string>((resolve, reject) => {
      child.once('message', (message: ServerReady) => resolve(message.url));
      child.once('exit', (code) =>
        reject(new Error(`bench server exited with ${code} before listening:\n${log.lines.join('\n')}`)),
      );
    });
    return new ServerProcess(child, url, log);
  }

  private send(command: ServerCommand): Promise<ServerReply> {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, (reply) => (reply.error ? reject(new Error(reply.error)) : resolve(reply)));
      this.child.send({ ...command, id });
    });
  }

  /** Starts a new counting window once the previous load has settled. */
  async reset(): Promise<void> {
    await this.settledStats();
    await this.send({ cmd: 'reset' });
  }

  async stats(): Promise<ServerStats> {
    return (await this.send({ cmd: 'stats' })).stats!;
  }

  /**
   * Stats once the server is quiet: nothing in flight, the pool idle and no statement sent
   * between two samples. autocannon drops its sockets when its time is up, and the server still
   * runs the handlers of the requests it dropped; their statements belong to the window that sent them.
   */
  async settledStats(timeoutMs = 15_000): Promise<ServerStats> {
    const deadline = Date.now() + timeoutMs;
    let previous = await this.stats();
    for (;;) {
      await new Promise((resolve) => setTimeout(resolve, 25));
      const stats = await this.stats();
      const { pool } = stats;
      const quiet =
        stats.inFlight === 0 &&
        pool.waiting === 0 &&
        pool.idle === pool.total &&
        stats.queries.queries === previous.queries.queries;
      if (quiet || Date.now() > deadline) return stats;
      previous = stats;
    }
  }

  async trace<T>(action: () => Promise<T>): Promise<{ result: T; queries: TracedQuery[] }> {
    await this.settledStats();
    await this.send({ cmd: 'trace-start' });
    const result = await action();
    await this.settledStats();
    const queries = (await this.send({ cmd: 'trace-stop' })).trace ?? [];
    return { result, queries };
  }

  /**
   * The async resources the server's requests created, by type, while `action` ran (the server
   * counts only what requests start: see bench/server/async-counter.ts). The window opens once the
   * server is quiet and closes once it is quiet again, so nothing `action` started is cut off.
   */
  async countAsync(action: () => Promise<unknown>): Promise<AsyncCounts> {
    await this.settledStats();
    await this.send({ cmd: 'count-start' });
    await action();
    await this.settledStats();
    return (await this.send({ cmd: 'count-stop' })).asyncCounts ?? {};
  }

  async startProfile(): Promise<void> {
    await this.send({ cmd: 'profile-start' });
  }

  async stopProfile(path: string): Promise<void> {
    await this.send({ cmd: 'profile-stop', path });
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    await this.send({ cmd: 'shutdown' }).catch(() => undefined);
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
}
