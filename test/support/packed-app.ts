import { spawn } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, rename, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/** An app from test/packaging/apps/, copied to a temporary directory, with the packed library installed. */
export interface PackedApp {
  /** The app's directory. */
  dir: string;
  /** Runs `command` in the app; rejects with everything it printed unless it exits 0. */
  run(command: string, args: string[], env?: Record<string, string>): Promise<string>;
  /** Starts `command` in the app and leaves it running (a server), in a process group of its own. */
  start(command: string, args: string[], env?: Record<string, string>): StartedCommand;
  /** Deletes the app, its node_modules and the tarball. */
  remove(): Promise<void>;
}

/** A command started by PackedApp.start(), still running until it exits or is stopped. */
export interface StartedCommand {
  /** Everything it printed so far. */
  output(): string;
  /** Its exit code (null when a signal ended it), once it has exited. */
  exited: Promise<number | null>;
  /** SIGTERM to its process group, SIGKILL if it is still there after a few seconds; resolves once it exited. */
  stop(): Promise<void>;
}

/** How long a started command may take to end on SIGTERM before it is killed. */
const STOP_GRACE_MS = 5_000;

/** Kept between runs (`.data/` is git-ignored), so a second run installs from disk. */
const NPM_CACHE = resolve('.data/npm-cache');

/** A command that runs longer is killed, with its process group, and reported with its output. */
const COMMAND_TIMEOUT_MS = 150_000;

/**
 * What npm says when the registry failed rather than the install line: the network, or a version
 * that the registry's other answers require and its own document of that package does not list
 * yet (ETARGET for `@babel/compat-data@^7.29.17` in one run of 2026-12-04, while the runs just
 * before and after installed it). Such an install is tried once more, revalidating what the first
 * try cached (`--prefer-online`); a wrong version in an install line fails both times.
 */
const REGISTRY_FAILURE = /\b(ETARGET|ECONNRESET|ETIMEDOUT|EAI_AGAIN|ENOTFOUND|E50[0-9]|socket hang up)\b/;
/** Before the second try, so that it does not meet the same stale answer at once. */
const REGISTRY_RETRY_PAUSE_MS = 5_000;

/**
 * The environment an app's commands see: this run's, without what would make them behave
 * unlike a user's shell. NODE_OPTIONS carries `--experimental-vm-modules` from `npm test`, which
 * would give the app's Jest the import() support its default set-up lacks; npm_* would point its
 * npm at this repository's configuration; JEST_* would tell its Jest it is one of our workers.
 */
function appEnvironment(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (name === 'NODE_OPTIONS' || /^(npm_|JEST_)/i.test(name)) continue;
    env[name] = value;
  }
  return { ...env, NO_COLOR: '1', CI: 'true', ...extra };
}

/** Runs a command to its end, bounded in time; resolves with its exit code and output. */
function execute(
  command: string,
  args: string[],
  cwd: string,
  env: NodeJS.ProcessEnv,
): Promise<{ code: number | null; output: string }> {
  return new Promise((done, fail) => {
    // Its own process group: npx starts the runner as a grandchild, which a timeout must stop too.
    const child = spawn(command, args, { cwd, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk) => (output += chunk));
    child.stderr.on('data', (chunk) => (output += chunk));
    const timer = setTimeout(() => {
      output += `\n[killed after ${COMMAND_TIMEOUT_MS} ms]`;
      process.kill(-child.pid!, 'SIGKILL');
    }, COMMAND_TIMEOUT_MS);
    child.once('error', (error) => {
      clearTimeout(timer);
      fail(error);
    });
    child.once('close', (code) => {
      clearTimeout(timer);
      done({ code, output });
    });
  });
}

/** Starts a command without waiting for it; see StartedCommand. */
function startCommand(command: string, args: string[], cwd: string, env: NodeJS.ProcessEnv): StartedCommand {
  const child = spawn(command, args, { cwd, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  const exited = new Promise<number | null>((done) => {
    child.once('error', (error) => {
      output += `\n${String(error)}`;
      done(null);
    });
    child.once('close', (code) => done(code));
  });
  const signal = (name: NodeJS.Signals) => {
    try {
      process.kill(-child.pid!, name);
    } catch {
      // Already gone.
    }
  };
  return {
    output: () => output,
    exited,
    async stop() {
      signal('SIGTERM');
      const timer = setTimeout(() => signal('SIGKILL'), STOP_GRACE_MS);
      await exited;
      clearTimeout(timer);
    },
  };
}

/**
 * Packs this repository as `npm pack` would publish it (the build must be current: `npm test`
 * builds first), copies the app `template` from test/packaging/apps/ beside the tarball and
 * installs it with npm from the registry, as a user would, together with `packages` (the docs'
 * install line for such an app): one `npm install <packages>` in the app installs its own
 * dependencies and those, as a reader's `npm install <packages>` in a fresh app does, in one
 * resolution instead of two. The app depends on `file:../library.tgz`, so it gets the package's
 * files and nothing else of this checkout.
 */
export async function installPackedApp(template: string, packages: string[] = []): Promise<PackedApp> {
  const root = await mkdtemp(join(tmpdir(), `niw-${template}-`));
  const remove = () => rm(root, { recursive: true, force: true });
  try {
    const env = appEnvironment({});
    const packed = await execute(
      'npm',
      ['pack', '--ignore-scripts', '--pack-destination', root],
      process.cwd(),
      env,
    );
    const tarballs = (await readdir(root)).filter((file) => file.endsWith('.tgz'));
    if (packed.code !== 0 || tarballs.length !== 1) throw new Error(`npm pack failed:\n${packed.output}`);
    await rename(join(root, tarballs[0]), join(root, 'library.tgz'));

    const dir = join(root, 'app');
    await cp(resolve('test/packaging/apps', template), dir, { recursive: true });
    await mkdir(NPM_CACHE, { recursive: true });
    const app: PackedApp = {
      dir,
      async run(command, args, extra = {}) {
        const { code, output } = await execute(command, args, dir, appEnvironment(extra));
        if (code !== 0)
          throw new Error(`${command} ${args.join(' ')} exited with ${code} in ${dir}:\n${output}`);
        return output;
      },
      start: (command, args, extra = {}) => startCommand(command, args, dir, appEnvironment(extra)),
      remove,
    };
    const install = (cached: '--prefer-offline' | '--prefer-online') =>
      app.run('npm', ['install', '--no-audit', '--no-fund', cached, '--cache', NPM_CACHE, ...packages]);
    await install('--prefer-offline').catch(async (error: Error) => {
      if (!REGISTRY_FAILURE.test(error.message)) throw error;
      await sleep(REGISTRY_RETRY_PAUSE_MS);
      await install('--prefer-online');
    });
    return app;
  } catch (error) {
    await remove();
    throw error;
  }
}
