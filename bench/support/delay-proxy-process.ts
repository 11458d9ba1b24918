import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/** The proxy's source; it is compiled beside the compiled bench on first use. */
const SOURCE = fileURLToPath(new URL('../../../bench/support/delay-proxy.c', import.meta.url));
const BINARY = fileURLToPath(new URL('./delay-proxy', import.meta.url));

/** What the proxy passed and what it cost, since the last reset. */
export interface DelayProxyStats {
  connections: number;
  /** Chunks forwarded (one read each), app → database and back. */
  chunksUp: number;
  chunksDown: number;
  bytes: number;
  /** CPU of the proxy process, in microseconds. */
  cpuUs: number;
  elapsedMs: number;
  /** How long chunks really waited, in ms (delay > 0 only): the target plus the clock's lateness. */
  achievedMs: { count: number; mean: number; p50: number; p99: number; max: number } | null;
}

/**
 * Compiles bench/support/delay-proxy.c with the system's C compiler (`cc`, or `$CC`) when the
 * binary is missing or older than its source. Only `--latency-ms` needs it.
 */
export function buildDelayProxy(): string {
  if (existsSync(BINARY) && statSync(BINARY).mtimeMs >= statSync(SOURCE).mtimeMs) return BINARY;
  mkdirSync(dirname(BINARY), { recursive: true });
  const compiler = process.env.CC || 'cc';
  try {
    execFileSync(compiler, ['-O2', '-Wall', '-o', BINARY, SOURCE], { stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (error) {
    const { stderr } = error as { stderr?: Buffer };
    throw new Error(
      `--latency-ms needs a C compiler to build its delay proxy (${compiler} ${SOURCE}): ${stderr?.toString() ?? error}`,
      { cause: error },
    );
  }
  return BINARY;
}

/**
 * The delay proxy (delay-proxy.c) in its own process, between the app and PostgreSQL, holding
 * every chunk `delayMs` in each direction; driven over its stdin and stdout.
 */
export class DelayProxyProcess {
  private readonly replies: ((line: string) => void)[] = [];
  private queue: Promise<unknown> = Promise.resolve();

  private constructor(
    private readonly child: ChildProcess,
    private readonly port: number,
    readonly delayMs: number,
    lines: AsyncIterator<string>,
  ) {
    void (async () => {
      for (let next = await lines.next(); !next.done; next = await lines.next()) {
        this.replies.shift()?.(next.value);
      }
      for (const reply of this.replies.splice(0)) reply('{"error":"delay proxy exited"}');
    })();
  }

  /** Starts a proxy in front of the server `databaseUrl` points at. */
  static async start(databaseUrl: string, delayMs: number): Promise<DelayProxyProcess> {
    const target = new URL(databaseUrl);
    const child = spawn(buildDelayProxy(), [target.hostname, target.port || '5432', String(delayMs)], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
    const first = await lines.next();
    const port = Number(/^port (\d+)$/.exec(first.done ? '' : first.value)?.[1]);
    if (!(port > 0)) {
      child.kill();
      throw new Error(`delay proxy did not start (${first.done ? 'exited' : first.value})`);
    }
    return new DelayProxyProcess(child, port, delayMs, lines);
  }

  /** `databaseUrl` with its host and port replaced by the proxy's. */
  urlFor(databaseUrl: string): string {
    const url = new URL(databaseUrl);
    url.hostname = '127.0.0.1';
    url.port = String(this.port);
    return url.toString();
  }

  async reset(): Promise<void> {
    await this.send('reset');
  }

  async stats(): Promise<DelayProxyStats> {
    return (await this.send('stats')) as DelayProxyStats;
  }

  /** Closes its stdin, which ends it, and its connections with it. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.stdin!.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  }

  /** One command, one line of JSON back; commands are sent one at a time. */
  private send(command: 'stats' | 'reset'): Promise<unknown> {
    const answer = this.queue.then(
      () =>
        new Promise<unknown>((resolve, reject) => {
          this.replies.push((line) => {
            const parsed = JSON.parse(line) as { error?: string };
            if (parsed.error) reject(new Error(`delay proxy: ${parsed.error}`));
            else resolve(parsed);
          });
          this.child.stdin!.write(`${command}\n`);
        }),
    );
    this.queue = answer.catch(() => undefined);
    return answer;
  }
}
