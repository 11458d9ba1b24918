import type { ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import type { IdempotencyMetrics } from '../../lib/observability/index.js';
import type { BullWorkerSettings } from '../fixtures/bullmq.fixture.js';
import { forkGatedChild } from './gated-child.js';

/** What `IdempotencyMetrics.snapshot()` returned in the child. */
export type MetricsSnapshot = ReturnType<IdempotencyMetrics['snapshot']>;

/** A BullMQ worker app in a child process: what the race and crash tests run and kill. */
export interface BullWorkerProcess {
  /** The WORKER_TAG it runs as. */
  tag: string;
  process: ChildProcess;
  /** Everything the child wrote to stdout and stderr so far (its Nest logs). */
  output(): string;
  /** Resolves when a job of `eventId` has claimed and reached its gate in the child; rejects after `timeoutMs`. */
  entered(eventId: string, timeoutMs?: number): Promise<void>;
  /** True once a job of `eventId` has reached its gate in the child. */
  hasEntered(eventId: string): boolean;
  /** Lets the job of `eventId` parked in the child go on (nothing, if none is parked there). */
  open(eventId: string): void;
  /** The child's IdempotencyMetrics totals. */
  metrics(): Promise<MetricsSnapshot>;
  /** SIGKILL: no shutdown hooks, no job or transaction is finished; Redis and Postgres see the connections die. */
  kill(): Promise<void>;
}

const CHILD_ENTRY = resolve('dist/test/fixtures/bullmq-worker-child.js');
/** Bounds every wait on the child, so a lost message fails the test naming it instead of hanging. */
const ANSWER_TIMEOUT_MS = 20_000;

/** Starts BullWorkerFixtureModule in a child process and resolves once its workers are connected. */
export async function startBullWorker(settings: BullWorkerSettings): Promise<BullWorkerProcess> {
  const child = await forkGatedChild<true>({
    entry: CHILD_ENTRY,
    env: { BULLMQ_WORKER_SETTINGS: JSON.stringify(settings) },
    name: `worker ${settings.tag}`,
    answerTimeoutMs: ANSWER_TIMEOUT_MS,
  });
  return {
    tag: settings.tag,
    process: child.process,
    output: child.output,
    entered: child.entered,
    hasEntered: child.hasEntered,
    open: child.open,
    metrics: () => child.ask<MetricsSnapshot>('metrics'),
    kill: child.kill,
  };
}
