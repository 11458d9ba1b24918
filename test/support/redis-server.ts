import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './postgres-server.js';
import { REDIS_SERVER, requireProgram } from './system-packages.js';

/** A running Redis server on loopback, for the BullMQ and microservice tests. */
export interface RedisServer {
  url: string;
  host: string;
  port: number;
  stop(): Promise<void>;
}

/** How long redis-server gets to say it is ready; it takes milliseconds when it works. */
const READY_TIMEOUT_MS = 10_000;

/**
 * Starts Debian's `redis-server` on a free loopback port, with no persistence and its files in a
 * temporary directory, or reuses `REDIS_URL`. Fails in seconds, naming the fix, when the binary is
 * missing (global-setup.mjs installs it where it can) or the server does not come up.
 */
export async function startRedis(): Promise<RedisServer> {
  if (process.env.REDIS_URL) {
    const url = new URL(process.env.REDIS_URL);
    return {
      url: url.toString(),
      host: url.hostname,
      port: Number(url.port || 6379),
      stop: async () => undefined,
    };
  }
  const binary = requireProgram(REDIS_SERVER);
  const dir = await mkdtemp(join(tmpdir(), 'idempotency-redis-'));
  const port = await freePort();
  const child = spawn(
    binary,
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  try {
    await new Promise<void>((ready, fail) => {
      const timer = setTimeout(
        () =>
          fail(
            new Error(`redis-server on port ${port} was not ready within ${READY_TIMEOUT_MS} ms:\n${output}`),
          ),
        READY_TIMEOUT_MS,
      );
      child.stdout.on('data', (chunk) => {
        output += chunk;
        if (output.includes('Ready to accept connections')) {
          clearTimeout(timer);
          ready();
        }
      });
      child.stderr.on('data', (chunk) => (output += chunk));
      child.once('error', (error) => {
        clearTimeout(timer);
        fail(error);
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        fail(new Error(`redis-server exited (${code}) before it was ready:\n${output}`));
      });
    });
  } catch (error) {
    child.kill('SIGKILL');
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    host: '127.0.0.1',
    port,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** The run's Redis server, started by global-setup.mjs. */
export function testRedis(): { url: string; host: string; port: number } {
  const url = process.env.TEST_REDIS_URL;
  if (!url)
    throw new Error('TEST_REDIS_URL is not set: run the tests through jest (test/support/global-setup.mjs)');
  const parsed = new URL(url);
  return { url, host: parsed.hostname, port: Number(parsed.port) };
}
