import type { ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import type { FixtureSettings } from '../fixtures/webhook-fixture.module.js';
import type { AdapterName } from './app.js';
import { forkGatedChild } from './gated-child.js';

/** A fixture app in a child process: the thing crash tests kill. */
export interface ChildApp {
  url: string;
  process: ChildProcess;
  /** Everything the child wrote to stdout and stderr so far (its Nest logs). */
  output(): string;
  /** Resolves when a handler for `id` has claimed and reached its gate in the child. */
  entered(id: string): Promise<void>;
  /** Lets the handler parked at `id` go on. */
  open(id: string): void;
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
  /** How long the child may take to listen (gated-child's default when unset: 30 s). */
  readyTimeoutMs?: number;
}

/** Starts WebhookFixtureModule (or `options.entry`) in a child process and waits until it listens. */
export async function startChildApp(
  adapter: AdapterName,
  settings: FixtureSettings,
  options: ChildAppOptions = {},
): Promise<ChildApp> {
  const child = await forkGatedChild<string>({
    entry: options.entry ?? CHILD_ENTRY,
    env: { FIXTURE_SETTINGS: JSON.stringify({ ...settings, adapter }) },
    name: 'fixture child',
    ...(options.readyTimeoutMs === undefined ? {} : { readyTimeoutMs: options.readyTimeoutMs }),
  });
  return {
    url: child.ready,
    process: child.process,
    output: child.output,
    entered: (id) => child.entered(id),
    open: child.open,
    kill: child.kill,
    stop: child.stop,
  };
}
