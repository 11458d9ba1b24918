import { spawn } from 'node:child_process';
import { freePort } from './postgres-server.js';
import { healthStatus } from './sample-process.js';
import { SAMPLE_TEST_SECRET } from './sample-stripe.js';
import { waitUntil } from './wait-until.js';

/** How long a start that builds first gets to answer /health: a cold build takes seconds. */
export const NPM_SAMPLE_READY_MS = 120_000;

/** `npm run sample` in a process group of its own: npm, the build, then the app it execs. */
export interface NpmSample {
  url: string;
  /** Everything npm, the build and the app wrote to stdout and stderr so far. */
  output(): string;
  /** Resolves once GET /health answers 200; rejects, with the output, if the start exits first. */
  ready(timeoutMs?: number): Promise<void>;
  /** Resolves once the output contains `text`. */
  said(text: string, timeoutMs?: number): Promise<void>;
  /** SIGTERM to the whole group (the sample drains and stops), then waits for npm to exit. */
  stop(): Promise<void>;
  /** SIGKILL to the whole group. */
  kill(): Promise<void>;
}

/**
 * Runs `npm run sample` in `cwd` as a user does, on a free port, with `databaseUrl` and the test
 * secret, and returns at once (the build comes first, then the app). Variables the sample reads
 * are decided here, not inherited from the shell.
 */
export async function spawnNpmSample(cwd: string, databaseUrl: string): Promise<NpmSample> {
  const port = await freePort();
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const name of ['FULFILMENT_URL', 'IDEMPOTENCY_LEASE_MS', 'IDEMPOTENCY_REPORT_INTERVAL_MS'])
    delete env[name];
  // Jest's --experimental-vm-modules is for Jest, not for the build or the app.
  delete env.NODE_OPTIONS;
  Object.assign(env, {
    NO_COLOR: '1',
    PORT: String(port),
    DATABASE_URL: databaseUrl,
    STRIPE_WEBHOOK_SECRET: SAMPLE_TEST_SECRET,
  });
  // detached: a group of its own, so stop() and kill() reach the app npm started, not only npm.
  const child = spawn('npm', ['run', 'sample'], {
    cwd,
    env,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  let gone = false;
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  void exited.then(() => (gone = true));
  const url = `http://127.0.0.1:${port}`;
  const signal = async (name: NodeJS.Signals) => {
    try {
      process.kill(-child.pid!, name);
    } catch {
      // ESRCH: the whole group has exited already.
    }
    await exited;
  };
  return {
    url,
    output: () => output,
    async ready(timeoutMs = NPM_SAMPLE_READY_MS) {
      try {
        await waitUntil(
          async () => {
            if (gone) throw new Error('npm run sample exited before it was ready');
            return (await healthStatus(url)) === 200;
          },
          'npm run sample to answer GET /health with 200',
          timeoutMs,
          100,
        );
      } catch (error) {
        throw new Error(`${(error as Error).message}\n--- output ---\n${output}`, { cause: error });
      }
    },
    said: (text, timeoutMs = NPM_SAMPLE_READY_MS) =>
      waitUntil(
        () => {
          if (gone && !output.includes(text)) throw new Error(`npm run sample exited:\n${output}`);
          return output.includes(text);
        },
        `npm run sample to say "${text}"`,
        timeoutMs,
        20,
      ),
    stop: () => signal('SIGTERM'),
    kill: () => signal('SIGKILL'),
  };
}
