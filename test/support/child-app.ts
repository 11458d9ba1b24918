import { fork, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import type { FixtureSettings } from '../fixtures/webhook-fixture.module.js';
import type { AdapterName } from './app.js';

/** A fixture app in a child process: the thing crash tests kill. */
export interface ChildApp {
  url: string;
  process: ChildProcess;
  /** Everything the child wrote to stdout and stderr so far (its Nest logs). */
  output(): string;
  /** Resolves when a handler for `id` has claimed and reached its gate in the child. */
  entered(id: string): Promise<void>;
  /** SIGKILL: no shutdown hooks, no rollback from the app; Postgres sees the connection die. */
  kill(): Promise<void>;
  /** Graceful stop (SIGTERM), for children the test is done with. */
  stop(): Promise<void>;
}

const CHILD_ENTRY = resolve('dist/test/fixtures/fixture-child.js');

/** Options of startChildApp. */
export interface ChildAppOptions {
  /**
   * The compiled entry point to run, for a fixture of its own (it must send `{ ready: url }`
   * like fixture-child, and takes its settings from FIXTURE_SETTINGS).
   * @default dist/test/fixtures/fixture-child.js (WebhookFixtureModule)
   */
  entry?: string;
}

/** Starts WebhookFixtureModule (or `options.entry`) in a child process and waits until it listens. */
export async function startChildApp(
  adapter: AdapterName,
  settings: FixtureSettings,
  options: ChildAppOptions = {},
): Promise<ChildApp> {
  const child = fork(options.entry ?? CHILD_ENTRY, [], {
    env: { ...process.env, FIXTURE_SETTINGS: JSON.stringify({ ...settings, adapter }) },
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  let output = '';
  child.stdout?.on('data', (chunk) => (output += chunk));
  child.stderr?.on('data', (chunk) => (output += chunk));
  const exited = new Promise<void>((done) => child.once('exit', () => done()));

  const entries = new Map<string, () => void>();
  const arrivals = new Map<string, Promise<void>>();
  const arrival = (id: string) => {
    if (!arrivals.has(id)) arrivals.set(id, new Promise((done) => entries.set(id, done)));
    return arrivals.get(id)!;
  };

  const url = await new Promise<string>((ready, fail) => {
    child.on('message', (message: { ready?: string; entered?: string }) => {
      if (message.ready) ready(message.ready);
      if (message.entered) {
        void arrival(message.entered);
        entries.get(message.entered)!();
      }
    });
    child.once('exit', (code) =>
      fail(new Error(`fixture child exited (${code}) before listening:\n${output}`)),
    );
  });

  return {
    url,
    process: child,
    output: () => output,
    entered: arrival,
    async kill() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
    },
  };
}
