import { fork, type ChildProcess } from 'node:child_process';
import { within } from './wait-until.js';

/**
 * A fixture app in a child process of its own: what crash tests SIGKILL, and what races between
 * two processes run. Every fixture child (test/fixtures/*-child.ts) speaks the same protocol over
 * its IPC channel (its side in test/support/child-entry.ts):
 *
 * | from | message | meaning |
 * |---|---|---|
 * | child | `{ ready: value }` | started (`value`: its URL, its port, or `true`) |
 * | child | `{ entered: id }` | a handler claimed and reached the gate `id` (Gates in the fixture) |
 * | parent | `{ open: id }` | lets the handler parked at `id` go on |
 * | parent | `{ <question>: true }` | asks; the child answers `{ <question>: answer }` |
 */
export interface GatedChild<Ready> {
  process: ChildProcess;
  /** What the child sent with `ready`. */
  ready: Ready;
  /** Everything the child wrote to stdout and stderr so far (its Nest logs). */
  output(): string;
  /**
   * Resolves when a handler has reached the gate `id` in the child; rejects after `timeoutMs`.
   * @default the child's answerTimeoutMs (unbounded without one)
   */
  entered(id: string, timeoutMs?: number): Promise<void>;
  /** True once a handler has reached the gate `id` in the child. */
  hasEntered(id: string): boolean;
  /** Lets the handler parked at `id` go on (nothing, if none is parked there). */
  open(id: string): void;
  /** Sends `{ [question]: true }` and resolves with the child's answer; rejects after answerTimeoutMs. */
  ask<Answer>(question: string): Promise<Answer>;
  /** Settles once the process has exited. */
  exited: Promise<void>;
  /** True once the process has exited. */
  ended(): boolean;
  /** SIGKILL: no shutdown hook runs, no transaction ends; Postgres sees the connections die. */
  kill(): Promise<void>;
  /** SIGTERM: the app closes gracefully. */
  stop(): Promise<void>;
}

/** Options of forkGatedChild. */
export interface GatedChildOptions {
  /** The compiled entry point (under dist/, built by `npm run build`). */
  entry: string;
  /** Variables added to the parent's environment: the child's settings. */
  env: Record<string, string>;
  /** Names the child in errors. */
  name: string;
  /**
   * Bounds the start: a Nest boot in a fresh Node process on a busy 2-core machine takes
   * seconds; this fails one that hangs instead, with its output.
   * @default 30000
   */
  readyTimeoutMs?: number;
  /**
   * Bounds each wait on a gate and each question, so a lost message fails the test naming it.
   * @default 20000 for questions; gates unbounded
   */
  answerTimeoutMs?: number;
}

const READY_TIMEOUT_MS = 30_000;
const ANSWER_TIMEOUT_MS = 20_000;

/** Forks `options.entry` and resolves once it has sent `{ ready }`; kills it if it does not. */
export async function forkGatedChild<Ready>(options: GatedChildOptions): Promise<GatedChild<Ready>> {
  const env: NodeJS.ProcessEnv = { ...process.env, ...options.env };
  // Jest's --experimental-vm-modules is for Jest, not for the app under test.
  delete env.NODE_OPTIONS;
  const child = fork(options.entry, [], { env, stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
  let output = '';
  child.stdout?.on('data', (chunk) => (output += chunk));
  child.stderr?.on('data', (chunk) => (output += chunk));
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  const ended = () => child.exitCode !== null || child.signalCode !== null;
  const signal = async (name: NodeJS.Signals) => {
    if (!ended()) child.kill(name);
    await exited;
  };

  const arrived = new Set<string>();
  const entries = new Map<string, () => void>();
  const arrivals = new Map<string, Promise<void>>();
  const arrival = (id: string) => {
    if (!arrivals.has(id)) arrivals.set(id, new Promise((done) => entries.set(id, done)));
    return arrivals.get(id)!;
  };
  const answers = new Map<string, ((answer: unknown) => void)[]>();
  let ready!: (value: Ready) => void;
  const isReady = new Promise<Ready>((done) => (ready = done));
  child.on('message', (message: Record<string, unknown>) => {
    for (const [key, value] of Object.entries(message)) {
      if (key === 'ready') ready(value as Ready);
      else if (key === 'entered') {
        const id = value as string;
        arrived.add(id);
        void arrival(id);
        entries.get(id)!();
      } else answers.get(key)?.shift()?.(value);
    }
  });

  let readyValue: Ready;
  try {
    readyValue = await within(
      Promise.race([
        isReady,
        exited.then((): never => {
          throw new Error(
            `${options.name} exited (${child.exitCode ?? child.signalCode}) before it was ready`,
          );
        }),
      ]),
      options.readyTimeoutMs ?? READY_TIMEOUT_MS,
      `${options.name} to be ready`,
    );
  } catch (error) {
    await signal('SIGKILL');
    throw new Error(`${error instanceof Error ? error.message : String(error)}:\n${output}`, {
      cause: error,
    });
  }

  return {
    process: child,
    ready: readyValue,
    output: () => output,
    entered(id, timeoutMs = options.answerTimeoutMs) {
      if (timeoutMs === undefined) return arrival(id);
      return within(arrival(id), timeoutMs, `a handler to reach the gate ${id} in ${options.name}`);
    },
    hasEntered: (id) => arrived.has(id),
    open: (id) => void child.send({ open: id }),
    ask: <Answer>(question: string) =>
      within(
        new Promise<Answer>((answer) => {
          if (!answers.has(question)) answers.set(question, []);
          answers.get(question)!.push(answer as (value: unknown) => void);
          child.send({ [question]: true });
        }),
        options.answerTimeoutMs ?? ANSWER_TIMEOUT_MS,
        `the ${question} of ${options.name}`,
      ),
    exited,
    ended,
    kill: () => signal('SIGKILL'),
    stop: () => signal('SIGTERM'),
  };
}
