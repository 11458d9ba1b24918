import { spawn } from 'node:child_process';
import { accessSync, constants, existsSync, statSync } from 'node:fs';
import { delimiter, join } from 'node:path';

/** A program the tests start, and the Debian package that ships it. */
export interface SystemProgram {
  binary: string;
  debianPackage: string;
  /** Homebrew's name for the same thing, for the message on macOS. */
  brewPackage: string;
  /** Why the tests need it, for the line that says it is being installed. */
  usedFor: string;
}

/** Redis, for the BullMQ and microservice tests (or REDIS_URL). */
export const REDIS_SERVER: SystemProgram = {
  binary: 'redis-server',
  debianPackage: 'redis-server',
  brewPackage: 'redis',
  usedFor: 'BullMQ and the microservice transports',
};

/** PgBouncer, for the pooler tests (or PGBOUNCER_BIN). */
export const PGBOUNCER: SystemProgram = {
  binary: 'pgbouncer',
  debianPackage: 'pgbouncer',
  brewPackage: 'pgbouncer',
  usedFor: 'the pooler tests',
};

/** Prometheus, for the scrape test of the sample's /metrics against the shipped alert rules. */
export const PROMETHEUS: SystemProgram = {
  binary: 'prometheus',
  debianPackage: 'prometheus',
  brewPackage: 'prometheus',
  usedFor: 'the scrape test of the alert rules',
};

/** promtool (Debian's prometheus package ships it beside the server), for `promtool test rules`. */
export const PROMTOOL: SystemProgram = {
  binary: 'promtool',
  debianPackage: 'prometheus',
  brewPackage: 'prometheus',
  usedFor: "the alert rules' unit tests",
};

/** Chromium, the real browser the console test drives headless (through playwright-core). */
export const CHROMIUM: SystemProgram = {
  binary: 'chromium',
  debianPackage: 'chromium',
  brewPackage: 'chromium',
  usedFor: 'the console test in a browser',
};

/** How long apt-get waits for another apt-get or dpkg to finish before it fails. */
const APT_LOCK_WAIT_SECONDS = 300;

/** What the set-up decides from: where programs are looked for, and what this machine allows. */
export interface MachineFacts {
  /** Directories searched for programs, in order. @default searchPaths() */
  dirs: string[];
  /** Running as root, who may install packages. */
  root: boolean;
  /** A Debian (or derived) system: /etc/debian_version exists. */
  debian: boolean;
  platform: NodeJS.Platform;
  /** Set: the tests use that Redis and start none. */
  redisUrl?: string;
  /** Set: the tests run that pgbouncer binary. */
  pgbouncerBin?: string;
}

/** What to do before the tests start. */
export type SystemPackagesPlan =
  | { action: 'none' }
  | { action: 'install'; packages: string[]; line: string }
  | { action: 'stop'; line: string };

/**
 * The directories searched for a program: PATH, then /usr/sbin and /usr/bin, where Debian puts
 * them (pgbouncer lives in /usr/sbin, which a normal user's PATH often lacks).
 */
export function searchPaths(path = process.env.PATH ?? ''): string[] {
  const dirs = [...path.split(delimiter).filter(Boolean), '/usr/sbin', '/usr/bin'];
  return [...new Set(dirs)];
}

/** The machine this process runs on. */
export function thisMachine(): MachineFacts {
  return {
    dirs: searchPaths(),
    root: process.getuid?.() === 0,
    debian: existsSync('/etc/debian_version'),
    platform: process.platform,
    redisUrl: process.env.REDIS_URL || undefined,
    pgbouncerBin: process.env.PGBOUNCER_BIN || undefined,
  };
}

/** The full path of the executable `binary` in the first of `dirs` that has one, or undefined. */
export function findBinary(binary: string, dirs: string[] = searchPaths()): string | undefined {
  for (const dir of dirs) {
    const path = join(dir, binary);
    try {
      accessSync(path, constants.X_OK);
      if (statSync(path).isFile()) return path;
    } catch {
      // Not here: the next directory.
    }
  }
  return undefined;
}

/** The programs the tests need on this machine that its search paths lack. */
export function missingPrograms(facts: MachineFacts): SystemProgram[] {
  const needed = [
    ...(facts.redisUrl ? [] : [REDIS_SERVER]),
    ...(facts.pgbouncerBin ? [] : [PGBOUNCER]),
    PROMETHEUS,
    PROMTOOL,
    CHROMIUM,
  ];
  return needed.filter((program) => !findBinary(program.binary, facts.dirs));
}

/**
 * Decides what the test set-up does about missing programs: nothing, install them (a Debian
 * machine, as root, with apt-get), or stop with one line naming the command to run.
 */
export function planSystemPackages(facts: MachineFacts): SystemPackagesPlan {
  const missing = missingPrograms(facts);
  if (missing.length === 0) return { action: 'none' };
  if (facts.debian && facts.root && findBinary('apt-get', facts.dirs)) {
    const packages = packagesOf(missing, 'debianPackage');
    const uses = missing.map((program) => `${program.binary} for ${program.usedFor}`).join(', ');
    return {
      action: 'install',
      packages,
      line: `Test set-up: ${namesOf(missing)} missing, running apt-get install -y ${packages.join(' ')} (the tests run ${uses})`,
    };
  }
  return { action: 'stop', line: notFoundLine(facts, missing) };
}

/**
 * The full path of `program` on this machine, for the helpers that start it; else throws a
 * SystemPackagesMissing naming the command that installs it (global-setup.mjs installs what it can
 * before any test starts, so this is for a run that skipped it).
 */
export function requireProgram(program: SystemProgram, facts: MachineFacts = thisMachine()): string {
  const path = findBinary(program.binary, facts.dirs);
  if (!path) throw new SystemPackagesMissing(notFoundLine(facts, [program]));
  return path;
}

/** `a`, `a and b`, `a, b and c`. */
function namesOf(programs: SystemProgram[]): string {
  const names = programs.map((program) => program.binary);
  return names.length <= 1 ? (names[0] ?? '') : `${names.slice(0, -1).join(', ')} and ${names.at(-1)}`;
}

/** The packages that ship `programs`, each once (prometheus ships two of them). */
function packagesOf(programs: SystemProgram[], manager: 'debianPackage' | 'brewPackage'): string[] {
  return [...new Set(programs.map((program) => program[manager]))];
}

/** One line: what is missing, where it was looked for, and the command that installs it. */
function notFoundLine(facts: MachineFacts, missing: SystemProgram[]): string {
  const redisUrl = missing.includes(REDIS_SERVER) ? ', or set REDIS_URL to a Redis of your own' : '';
  return `Test set-up: ${namesOf(missing)} not found (looked in PATH, /usr/sbin, /usr/bin): ${installCommand(facts, missing)}${redisUrl}`;
}

/** The command that installs `missing` on this kind of machine, in words to copy. */
function installCommand(facts: MachineFacts, missing: SystemProgram[]): string {
  if (facts.debian) {
    const sudo = facts.root ? '' : 'sudo ';
    return `run \`${sudo}apt-get install -y ${packagesOf(missing, 'debianPackage').join(' ')}\``;
  }
  if (facts.platform === 'darwin') {
    return `run \`brew install ${packagesOf(missing, 'brewPackage').join(' ')}\``;
  }
  return `install ${packagesOf(missing, 'debianPackage').join(' and ')} with your system's package manager`;
}

/** The set-up stopped: its message, one line, says why and what to run. */
export class SystemPackagesMissing extends Error {
  constructor(line: string) {
    super(line);
    this.name = 'SystemPackagesMissing';
    // The line is the whole story: Jest prints a failed global setup's stack, which would bury it.
    this.stack = line;
  }
}

/**
 * Before any test starts (test/support/global-setup.mjs): installs the programs the tests need
 * where they are missing and this machine may install them, saying so in one line through `say`;
 * otherwise throws a SystemPackagesMissing whose message is the one line naming the command to
 * run. apt-get update runs only when the install fails without it (a fresh image has no package
 * lists; a kept one needs no refresh).
 */
export async function ensureSystemPackages(
  facts: MachineFacts = thisMachine(),
  say: (line: string) => void = console.log,
): Promise<void> {
  const plan = planSystemPackages(facts);
  if (plan.action === 'none') return;
  if (plan.action === 'stop') throw new SystemPackagesMissing(plan.line);
  say(plan.line);
  const aptGet = findBinary('apt-get', facts.dirs)!;
  // Two test runs starting at once on a bare machine: the second waits for the first's dpkg lock.
  const waitForLock = ['-o', `DPkg::Lock::Timeout=${APT_LOCK_WAIT_SECONDS}`];
  const install = ['install', '-y', '-qq', ...waitForLock, ...plan.packages];
  let failure = await apt(aptGet, install);
  if (failure !== undefined) {
    const update = await apt(aptGet, ['update', '-qq', ...waitForLock]);
    failure = update ?? (await apt(aptGet, install));
  }
  const stillMissing = missingPrograms(facts);
  if (failure !== undefined || stillMissing.length > 0) {
    throw new SystemPackagesMissing(
      `Test set-up: apt-get install -y ${plan.packages.join(' ')} did not install ${
        namesOf(stillMissing) || 'them'
      }: ${failure ?? 'apt-get succeeded, but the programs are still not found'}`,
    );
  }
}

/** Runs apt-get without questions; undefined when it succeeded, else what it said. */
function apt(aptGet: string, args: string[]): Promise<string | undefined> {
  return new Promise((done) => {
    const child = spawn(aptGet, args, {
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (chunk) => (output += chunk));
    child.stderr.on('data', (chunk) => (output += chunk));
    child.once('error', (error) => done(`apt-get ${args[0]}: ${error.message}`));
    child.once('exit', (code) =>
      done(code === 0 ? undefined : `apt-get ${args[0]} exited with ${code}: ${output.trim()}`),
    );
  });
}
