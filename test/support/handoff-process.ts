import { fork, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import type { HandoffMetrics } from '../../lib/index.js';
import type { HandoffSettings } from '../fixtures/handoff.fixture.js';
import { within } from './wait-until.js';

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
/** An app boots in about a second; this bounds one that hangs instead. */
const READY_TIMEOUT_MS = 30_000;
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
  const env: NodeJS.ProcessEnv = { ...process.env, HANDOFF_SETTINGS: JSON.stringify(settings) };
  // Jest's --experimental-vm-modules is for Jest, not for the app under test.
  delete env.NODE_OPTIONS;
  if (environment.concurrency !== undefined) env.HANDOFF_CONCURRENCY = String(environment.concurrency);
  if (environment.leaseMs !== undefined) env.HANDOFF_LEASE_MS = String(environment.leaseMs);
  const tag = settings.tag ?? 'main';
  const child = fork(CHILD_ENTRY, [], { env, stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
  let output = '';
  child.stdout?.on('data', (chunk) => (output += chunk));
  child.stderr?.on('data', (chunk) => (output += chunk));
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  const signal = async (name: NodeJS.Signals) => {
    if (child.exitCode === null && child.signalCode === null) child.kill(name);
    await exited;
  };

  const arrived = new Set<string>();
  const entries = new Map<string, () => void>();
  const arrivals = new Map<string, Promise<void>>();
  const arrival = (id: string) => {
    if (!arrivals.has(id)) arrivals.set(id, new Promise((done) => entries.set(id, done)));
    return arrivals.get(id)!;
  };
  const metricsAnswers: ((snapshot: HandoffSnapshot) => void)[] = [];
  let ready!: (url: string | true) => void;
  const isReady = new Promise<string | true>((done) => (ready = done));
  child.on('message', (message: { ready?: string | true; entered?: string; metrics?: HandoffSnapshot }) => {
    if (message.ready) ready(message.ready);
    if (message.entered) {
      arrived.add(message.entered);
      void arrival(message.entered);
      entries.get(message.entered)!();
    }
    if (message.metrics) metricsAnswers.shift()?.(message.metrics);
  });

  let url: string | true;
  try {
    url = await within(
      Promise.race([
        isReady,
        exited.then((): never => {
          throw new Error(`handoff app ${tag} exited before it was ready`);
        }),
      ]),
      READY_TIMEOUT_MS,
      `handoff app ${tag} to be ready`,
    );
  } catch (error) {
    await signal('SIGKILL');
    throw new Error(`${error instanceof Error ? error.message : String(error)}\n${output}`, { cause: error });
  }

  return {
    tag,
    url: url === true ? '' : url,
    process: child,
    output: () => output,
    entered: (id, timeoutMs = ANSWER_TIMEOUT_MS) =>
      within(arrival(id), timeoutMs, `a handler to reach the gate ${id} in ${tag}`),
    hasEntered: (id) => arrived.has(id),
    open: (id) => void child.send({ open: id }),
    metrics: () =>
      within(
        new Promise<HandoffSnapshot>((answer) => {
          metricsAnswers.push(answer);
          child.send({ metrics: true });
        }),
        ANSWER_TIMEOUT_MS,
        `the metrics of ${tag}`,
      ),
    kill: () => signal('SIGKILL'),
    stop: () => signal('SIGTERM'),
  };
}
