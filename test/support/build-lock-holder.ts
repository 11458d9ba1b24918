import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { waitUntil } from './wait-until.js';

/** A process that takes a checkout's build lock (scripts/build-lock.mjs) and keeps it until told. */
export interface BuildLockHolder {
  pid: number;
  /** Everything it printed: `waiting <pid>` while another holds the lock, `held`, `released`. */
  output(): string;
  /** Resolves once it holds the lock. */
  held(timeoutMs?: number): Promise<void>;
  /** Resolves once it said it waits, with the pid it waits for. */
  waiting(timeoutMs?: number): Promise<number>;
  /** Lets go of the lock and resolves when the process has exited (with its exit code). */
  release(): Promise<number | null>;
  /** SIGKILL: the lock is never released by the process itself. */
  kill(): Promise<void>;
}

/**
 * The script run by the holder: the lock module of `checkout`, as the build itself loads it. It
 * holds the lock until a line arrives on stdin (or stdin closes: the test went away).
 */
const HOLDER = `
const [checkout, address] = JSON.parse(process.argv[1]);
const { withBuildLock } = await import(process.env.BUILD_LOCK_MODULE);
await withBuildLock(
  checkout,
  () => {
    console.log('held');
    return new Promise((done) => { process.stdin.once('data', done); process.stdin.once('end', done); });
  },
  { address, onWait: (pid) => console.log('waiting ' + pid) },
);
console.log('released');
`;

/**
 * Starts a process that takes the build lock of `checkout`, at `address` (a socket path or an
 * abstract `\0name`; default: the one the checkout's builds use).
 */
export function holdBuildLock(checkout: string, address?: string): BuildLockHolder {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    BUILD_LOCK_MODULE: pathToFileURL(join(checkout, 'scripts/build-lock.mjs')).href,
  };
  // Jest's --experimental-vm-modules is for Jest, not for this process.
  delete env.NODE_OPTIONS;
  const child = spawn(
    process.execPath,
    [
      '--input-type=module',
      '-e',
      HOLDER,
      // JSON: an abstract address starts with a NUL byte, which an argument cannot hold.
      JSON.stringify([checkout, address]),
    ],
    {
      env,
      stdio: ['pipe', 'pipe', 'pipe'],
    },
  );
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  const exited = new Promise<number | null>((done) => child.once('exit', (code) => done(code)));
  let gone = false;
  void exited.then(() => (gone = true));
  const said = (what: string, timeoutMs: number) =>
    waitUntil(
      () => {
        if (gone && !output.includes(what)) throw new Error(`the lock holder exited:\n${output}`);
        return output.includes(what);
      },
      `the lock holder to say "${what}"`,
      timeoutMs,
      20,
    );
  return {
    pid: child.pid!,
    output: () => output,
    held: (timeoutMs = 15_000) => said('held', timeoutMs),
    async waiting(timeoutMs = 15_000) {
      await said('waiting ', timeoutMs);
      return Number(/waiting (\d+)/.exec(output)![1]);
    },
    release() {
      child.stdin.end('release\n');
      return exited;
    },
    async kill() {
      if (!gone) child.kill('SIGKILL');
      await exited;
    },
  };
}
