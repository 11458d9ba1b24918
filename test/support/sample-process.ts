import { spawn, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import { freePort } from './postgres-server.js';
import { SAMPLE_TEST_SECRET } from './sample-stripe.js';
import { waitUntil } from './wait-until.js';

/** The built sample, run exactly as `npm run sample` runs it. */
const SAMPLE_MAIN = resolve('dist/sample/main.js');
/** The promise: ready (GET /health 200) within 30 s of start. */
export const SAMPLE_READY_MS = 30_000;
/** Every variable the sample reads; the test decides each one, nothing leaks in from the shell. */
const SAMPLE_VARIABLES = [
  'PORT',
  'DATABASE_URL',
  'STRIPE_WEBHOOK_SECRET',
  'IDEMPOTENCY_LEASE_MS',
  'IDEMPOTENCY_REPORT_INTERVAL_MS',
  'FULFILMENT_URL',
];

/** Environment of one sample process; unset ones take the sample's defaults. */
export interface SampleSettings {
  /** Unset: the sample starts its embedded PostgreSQL under `<cwd>/.data/`. */
  databaseUrl?: string;
  fulfilmentUrl?: string;
  leaseMs?: number;
  reportIntervalMs?: number;
  /** @default SAMPLE_TEST_SECRET */
  webhookSecret?: string;
  /** Working directory (where `.data/` goes). @default the repository root */
  cwd?: string;
}

/** How a sample process ended. */
export interface SampleExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** A running sample in its own process: what the crash tests SIGKILL and the drain test SIGTERMs. */
export interface SampleProcess {
  url: string;
  pid: number;
  /** Everything it wrote to stdout and stderr so far (Nest logs, without colours). */
  output(): string;
  /** Resolves once the output contains every one of `parts` on one line. */
  waitForLog(parts: string[], timeoutMs?: number): Promise<void>;
  /** Sends `signal` without waiting. */
  signal(signal: NodeJS.Signals): void;
  /** Resolves when the process has exited. */
  exited: Promise<SampleExit>;
  /** SIGKILL: no shutdown code runs; Postgres sees the connections die. */
  kill(): Promise<SampleExit>;
  /** SIGTERM, the graceful stop. */
  terminate(): Promise<SampleExit>;
}

const running = new Set<SampleProcess>();

/**
 * Ports tried: freePort() closes the port it found before the sample listens on it, so another
 * process can take it first (a fresh-clone run failed so: listen EADDRINUSE); a new one is tried.
 */
const PORT_ATTEMPTS = 3;

/** Starts `node dist/sample/main.js` on a free port and waits until GET /health answers 200. */
export async function startSample(settings: SampleSettings): Promise<SampleProcess> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startSampleOn(await freePort(), settings);
    } catch (error) {
      if (attempt >= PORT_ATTEMPTS || !String(error).includes('EADDRINUSE')) throw error;
    }
  }
}

async function startSampleOn(port: number, settings: SampleSettings): Promise<SampleProcess> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const name of SAMPLE_VARIABLES) delete env[name];
  // Jest's --experimental-vm-modules is for Jest, not for the app under test.
  delete env.NODE_OPTIONS;
  Object.assign(env, {
    NO_COLOR: '1',
    PORT: String(port),
    STRIPE_WEBHOOK_SECRET: settings.webhookSecret ?? SAMPLE_TEST_SECRET,
    ...(settings.databaseUrl && { DATABASE_URL: settings.databaseUrl }),
    ...(settings.fulfilmentUrl && { FULFILMENT_URL: settings.fulfilmentUrl }),
    ...(settings.leaseMs && { IDEMPOTENCY_LEASE_MS: String(settings.leaseMs) }),
    ...(settings.reportIntervalMs && { IDEMPOTENCY_REPORT_INTERVAL_MS: String(settings.reportIntervalMs) }),
  });
  const child = spawn(process.execPath, [SAMPLE_MAIN], {
    cwd: settings.cwd ?? process.cwd(),
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.on('data', (chunk) => (output += chunk));
  child.stderr!.on('data', (chunk) => (output += chunk));
  const exited = new Promise<SampleExit>((done) =>
    child.once('exit', (code, signal) => done({ code, signal })),
  );
  let gone = false;
  void exited.then(() => (gone = true));

  const sample: SampleProcess = {
    url: `http://127.0.0.1:${port}`,
    pid: child.pid!,
    output: () => output,
    waitForLog: (parts, timeoutMs = 15_000) =>
      waitUntil(
        () => output.split('\n').some((line) => parts.every((part) => line.includes(part))),
        `a sample log line with ${JSON.stringify(parts)}`,
        timeoutMs,
      ),
    signal: (signal) => {
      if (!gone) child.kill(signal);
    },
    exited,
    kill: () => stop(child, 'SIGKILL', exited),
    terminate: () => stop(child, 'SIGTERM', exited),
  };
  running.add(sample);
  void exited.then(() => running.delete(sample));

  try {
    await waitUntil(
      async () => {
        if (gone) throw new Error(`the sample exited before it was ready:\n${output}`);
        return (await healthStatus(sample.url)) === 200;
      },
      'the sample to answer GET /health with 200',
      SAMPLE_READY_MS,
      100,
    );
  } catch (error) {
    await sample.kill();
    throw new Error(
      `${error instanceof Error ? error.message : String(error)}\n--- sample output ---\n${output}`,
      { cause: error },
    );
  }
  return sample;
}

/** SIGKILLs every sample still running, for afterAll (a failed test must not leave processes). */
export async function killAllSamples(): Promise<void> {
  await Promise.all([...running].map((sample) => sample.kill()));
}

/** GET /health's status, or undefined when nothing accepts the connection. */
export async function healthStatus(url: string): Promise<number | undefined> {
  try {
    const response = await fetch(`${url}/health`, { signal: AbortSignal.timeout(5_000) });
    await response.arrayBuffer();
    return response.status;
  } catch {
    return undefined;
  }
}

async function stop(child: ChildProcess, signal: NodeJS.Signals, exited: Promise<SampleExit>) {
  if (child.exitCode === null && child.signalCode === null) child.kill(signal);
  return exited;
}
