import type { ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import type { HandoffMetrics } from '../../lib/observability/index.js';
import type { HandoffSettings } from '../fixtures/handoff.fixture.js';
import { forkGatedChild } from './gated-child.js';

/** What `HandoffMetrics.snapshot()` returned in the child. */
export type HandoffSnapshot = ReturnType<HandoffMetrics['snapshot']>;

/** A handoff app in a child process: what the crash and race tests run and kill. */
export interface HandoffProcess {
  tag: string;
  /** The webhook's base URL, for an app started with `web: true`. */
  url: string;
  process: ChildProcess;
  /** Everything the child wrote to stdout and stderr so far (its Nest logs). */
  output(): string;
  /** Resolves when a handler has reached the gate `id` in the child; rejects after `timeoutMs`. */
  entered(id: string, timeoutMs?: number): Promise<void>;
  /** True once a handler has reached the gate `id` in the child. */
  hasEntered(id: string): boolean;
  /** Lets the handler parked at `id` go on. */
  open(id: string): void;
  /** The child's HandoffMetrics. */
  metrics(): Promise<HandoffSnapshot>;
  /** SIGKILL: no shutdown hook runs, no transaction ends; Postgres sees the connections die. */
  kill(): Promise<void>;
  /** SIGTERM: the app closes (its workers drain). */
  stop(): Promise<void>;
}

const CHILD_ENTRY = resolve('dist/test/fixtures/handoff-child.js');
/** Bounds every wait on the child, so a lost message fails the test naming it instead of hanging. */
const ANSWER_TIMEOUT_MS = 20_000;

/** Worker settings the fixture's decorators read from the child's environment. */
export interface HandoffEnvironment {
  /** Each worker's concurrency in the child. */
  concurrency?: number;
  /** The external worker's lease in the child, ms. */
  leaseMs?: number;
}

/** Starts HandoffFixtureModule in a child process and resolves once it has started. */
export async function startHandoffProcess(
  settings: HandoffSettings,
  environment: HandoffEnvironment = {},
): Promise<HandoffProcess> {
  const env: Record<string, string> = { HANDOFF_SETTINGS: JSON.stringify(settings) };
  if (environment.concurrency !== undefined) env.HANDOFF_CONCURRENCY = String(environment.concurrency);
  if (environment.leaseMs !== undefined) env.HANDOFF_LEASE_MS = String(environment.leaseMs);
  const tag = settings.tag ?? 'main';
  const child = await forkGatedChild<string | true>({
    entry: CHILD_ENTRY,
    env,
    name: `handoff app ${tag}`,
    answerTimeoutMs: ANSWER_TIMEOUT_MS,
  });
  return {
    tag,
    url: child.ready === true ? '' : child.ready,
    process: child.process,
    output: child.output,
    entered: child.entered,
    hasEntered: child.hasEntered,
    open: child.open,
    metrics: () => child.ask<HandoffSnapshot>('metrics'),
    kill: child.kill,
    stop: child.stop,
  };
}
