import { fork, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import type { IdempotencyMetrics } from '../../lib/index.js';
import type { BullWorkerSettings } from '../fixtures/bullmq.fixture.js';
import { within } from './wait-until.js';

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
/** A worker app boots in well under a second; this bounds a child that hangs instead. */
const READY_TIMEOUT_MS = 30_000;
/** Bounds every wait on the child, so a lost message fails the test naming it instead of hanging. */
const ANSWER_TIMEOUT_MS = 20_000;

/** Starts BullWorkerFixtureModule in a child process and resolves once its workers are connected. */
export async function startBullWorker(settings: BullWorkerSettings): Promise<BullWorkerProcess> {
  const env: NodeJS.ProcessEnv = { ...process.env, BULLMQ_WORKER_SETTINGS: JSON.stringify(settings) };
  // Jest's --experimental-vm-modules is for Jest, not for the app under test.
  delete env.NODE_OPTIONS;
  const child = fork(CHILD_ENTRY, [], { env, stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
  let output = '';
  child.stdout?.on('data', (chunk) => (output += chunk));
  child.stderr?.on('data', (chunk) => (output += chunk));
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  const kill = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  };

  const arrived = new Set<string>();
  const entries = new Map<string, () => void>();
  const arrivals = new Map<string, Promise<void>>();
  const arrival = (id: string) => {
    if (!arrivals.has(id)) arrivals.set(id, new Promise((done) => entries.set(id, done)));
    return arrivals.get(id)!;
  };
  const metricsAnswers: ((snapshot: MetricsSnapshot) => void)[] = [];
  let ready!: () => void;
  const isReady = new Promise<void>((done) => (ready = done));
  child.on('message', (message: { ready?: boolean; entered?: string; metrics?: MetricsSnapshot }) => {
    if (message.ready) ready();
    if (message.entered) {
      arrived.add(message.entered);
      void arrival(message.entered);
      entries.get(message.entered)!();
    }
    if (message.metrics) metricsAnswers.shift()?.(message.metrics);
  });

  try {
    await within(
      Promise.race([
        isReady,
        exited.then(() => {
          throw new Error(`worker ${settings.tag} exited before it was ready:\n${output}`);
        }),
      ]),
      READY_TIMEOUT_MS,
      `worker ${settings.tag} to be ready`,
    );
  } catch (error) {
    await kill();
    throw new Error(`${error instanceof Error ? error.message : String(error)}\n${output}`, { cause: error });
  }

  return {
    tag: settings.tag,
    process: child,
    output: () => output,
    entered: (eventId, timeoutMs = ANSWER_TIMEOUT_MS) =>
      within(arrival(eventId), timeoutMs, `a job of ${eventId} to reach its gate in worker ${settings.tag}`),
    hasEntered: (eventId) => arrived.has(eventId),
    open: (eventId) => void child.send({ open: eventId }),
    metrics: () =>
      within(
        new Promise<MetricsSnapshot>((answer) => {
          metricsAnswers.push(answer);
          child.send({ metrics: true });
        }),
        ANSWER_TIMEOUT_MS,
        `the metrics of worker ${settings.tag}`,
      ),
    kill,
  };
}
