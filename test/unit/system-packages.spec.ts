import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import {
  ensureSystemPackages,
  findBinary,
  planSystemPackages,
  searchPaths,
  SystemPackagesMissing,
  thisMachine,
  type MachineFacts,
} from '../support/system-packages.js';

/**
 * What the test set-up does when redis-server or pgbouncer is missing, decided from search paths
 * the test chooses: an empty directory is a machine without them. Nothing here installs or removes
 * a real package (other runs on this machine use them); the install itself runs a stand-in apt-get
 * in such a directory, which records how it was called.
 */
describe('test set-up: system packages', () => {
  let empty: string;
  let bin: string;
  /** prometheus, promtool and chromium: the tests of redis-server and pgbouncer have them. */
  let observability: string;

  beforeEach(async () => {
    empty = await mkdtemp(join(tmpdir(), 'no-programs-'));
    bin = await mkdtemp(join(tmpdir(), 'programs-'));
    observability = await mkdtemp(join(tmpdir(), 'observability-programs-'));
    for (const name of ['prometheus', 'promtool', 'chromium']) await executable(observability, name);
  });

  afterEach(async () => {
    await Promise.all([empty, bin, observability].map((dir) => rm(dir, { recursive: true, force: true })));
  });

  const executable = async (dir: string, name: string, script = '#!/bin/sh\n') => {
    await writeFile(join(dir, name), script);
    await chmod(join(dir, name), 0o755);
  };
  const machine = (facts: Partial<MachineFacts>): MachineFacts => ({
    root: true,
    debian: true,
    platform: 'linux',
    ...facts,
    dirs: [...(facts.dirs ?? [empty]), observability],
  });

  it('finds an executable in the first directory that has one, and not a plain file', async () => {
    await writeFile(join(empty, 'redis-server'), 'not a program');
    await executable(bin, 'redis-server');
    expect(findBinary('redis-server', [empty])).toBeUndefined();
    expect(findBinary('redis-server', [empty, bin])).toBe(join(bin, 'redis-server'));
    expect(findBinary('pgbouncer', [empty, bin])).toBeUndefined();
  });

  it('looks in PATH first, then /usr/sbin and /usr/bin (pgbouncer is in /usr/sbin on Debian)', () => {
    expect(searchPaths('/opt/a:/usr/bin:/opt/b')).toEqual(['/opt/a', '/usr/bin', '/opt/b', '/usr/sbin']);
    expect(searchPaths('')).toEqual(['/usr/sbin', '/usr/bin']);
  });

  it('does nothing when both programs are there', async () => {
    await executable(bin, 'redis-server');
    await executable(bin, 'pgbouncer');
    expect(planSystemPackages(machine({ dirs: [empty, bin] }))).toEqual({ action: 'none' });
  });

  it('installs both with apt-get on Debian as root, and says so in one line', async () => {
    await executable(bin, 'apt-get');
    expect(planSystemPackages(machine({ dirs: [empty, bin] }))).toEqual({
      action: 'install',
      packages: ['redis-server', 'pgbouncer'],
      line:
        'Test set-up: redis-server and pgbouncer missing, running apt-get install -y redis-server pgbouncer ' +
        '(the tests run redis-server for BullMQ and the microservice transports, pgbouncer for the pooler tests)',
    });
  });

  it('stops with the command to run when it may not install: not root, or no apt-get', async () => {
    await executable(bin, 'apt-get');
    expect(planSystemPackages(machine({ dirs: [empty, bin], root: false }))).toEqual({
      action: 'stop',
      line:
        'Test set-up: redis-server and pgbouncer not found (looked in PATH, /usr/sbin, /usr/bin): ' +
        'run `sudo apt-get install -y redis-server pgbouncer`, or set REDIS_URL to a Redis of your own',
    });
    expect(planSystemPackages(machine({ dirs: [empty] }))).toMatchObject({
      action: 'stop',
      line: expect.stringContaining('run `apt-get install -y redis-server pgbouncer`'),
    });
  });

  it('names the command of the system it runs on: brew on macOS, the package names elsewhere', () => {
    const mac = planSystemPackages(machine({ debian: false, platform: 'darwin', root: false }));
    expect(mac).toMatchObject({
      action: 'stop',
      line: expect.stringContaining('run `brew install redis pgbouncer`'),
    });
    const other = planSystemPackages(machine({ debian: false, platform: 'freebsd' }));
    expect(other).toMatchObject({
      action: 'stop',
      line: expect.stringContaining("install redis-server and pgbouncer with your system's package manager"),
    });
  });

  it('needs no redis-server with REDIS_URL set, and no pgbouncer with PGBOUNCER_BIN set', async () => {
    await executable(bin, 'apt-get');
    expect(planSystemPackages(machine({ dirs: [bin], redisUrl: 'redis://127.0.0.1:6379' }))).toMatchObject({
      action: 'install',
      packages: ['pgbouncer'],
    });
    const stop = planSystemPackages(machine({ root: false, redisUrl: 'redis://127.0.0.1:6379' }));
    expect(stop).toEqual({
      action: 'stop',
      line: 'Test set-up: pgbouncer not found (looked in PATH, /usr/sbin, /usr/bin): run `sudo apt-get install -y pgbouncer`',
    });
    expect(planSystemPackages(machine({ redisUrl: 'redis://x', pgbouncerBin: '/opt/pgbouncer' }))).toEqual({
      action: 'none',
    });
  });

  it('installs prometheus once for both of its programs, and chromium, beside the others', async () => {
    await executable(bin, 'apt-get');
    await rm(join(observability, 'promtool'));
    await rm(join(observability, 'chromium'));
    expect(planSystemPackages(machine({ dirs: [empty, bin] }))).toEqual({
      action: 'install',
      packages: ['redis-server', 'pgbouncer', 'prometheus', 'chromium'],
      line:
        'Test set-up: redis-server, pgbouncer, promtool and chromium missing, running apt-get install -y ' +
        'redis-server pgbouncer prometheus chromium (the tests run redis-server for BullMQ and the microservice ' +
        "transports, pgbouncer for the pooler tests, promtool for the alert rules' unit tests, chromium for the " +
        'console test in a browser)',
    });
    await rm(join(observability, 'prometheus'));
    expect(
      planSystemPackages(machine({ dirs: [bin], redisUrl: 'redis://x', pgbouncerBin: '/x' })),
    ).toMatchObject({
      action: 'install',
      packages: ['prometheus', 'chromium'],
    });
    expect(planSystemPackages(machine({ root: false, redisUrl: 'redis://x', pgbouncerBin: '/x' }))).toEqual({
      action: 'stop',
      line:
        'Test set-up: prometheus, promtool and chromium not found (looked in PATH, /usr/sbin, /usr/bin): ' +
        'run `sudo apt-get install -y prometheus chromium`',
    });
  });

  it('finds both on this machine, as the run needs them (the global set-up installed them if it had to)', () => {
    expect(planSystemPackages({ ...thisMachine(), redisUrl: undefined, pgbouncerBin: undefined })).toEqual({
      action: 'none',
    });
  });

  /**
   * A stand-in for apt-get in the search path: it logs each call, fails an install until an update
   * has run (a fresh image has no package lists), and "installs" a package by writing a program of
   * that name beside itself.
   */
  const APT_GET = `#!/bin/sh
dir=$(dirname "$0")
echo "DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> "$dir/calls.log"
case "$1" in
  update) touch "$dir/lists" ;;
  install)
    if [ ! -f "$dir/lists" ] && [ -z "$HAS_LISTS" ]; then echo "E: Unable to locate package redis-server"; exit 100; fi
    for name in "$@"; do
      case "$name" in redis-server|pgbouncer) printf '#!/bin/sh\\n' > "$dir/$name"; chmod +x "$dir/$name" ;; esac
    done ;;
esac
`;
  const calls = async () => (await readFile(join(bin, 'calls.log'), 'utf8')).trim().split('\n');
  const LOCK = '-o DPkg::Lock::Timeout=300';

  it('installs once, running apt-get update only after an install that failed without it', async () => {
    await executable(bin, 'apt-get', APT_GET);
    const said: string[] = [];
    await ensureSystemPackages(machine({ dirs: [empty, bin] }), (line) => said.push(line));
    expect(said).toEqual([
      expect.stringMatching(/^Test set-up: redis-server and pgbouncer missing, running apt-get/),
    ]);
    expect(await calls()).toEqual([
      `DEBIAN_FRONTEND=noninteractive install -y -qq ${LOCK} redis-server pgbouncer`,
      `DEBIAN_FRONTEND=noninteractive update -qq ${LOCK}`,
      `DEBIAN_FRONTEND=noninteractive install -y -qq ${LOCK} redis-server pgbouncer`,
    ]);
    expect(planSystemPackages(machine({ dirs: [empty, bin] }))).toEqual({ action: 'none' });

    // Installed: the next run finds them and calls apt-get no more.
    await ensureSystemPackages(machine({ dirs: [empty, bin] }), (line) => said.push(line));
    expect(said).toHaveLength(1);
    expect(await calls()).toHaveLength(3);
  });

  it('skips apt-get update when the install works without it', async () => {
    await executable(bin, 'apt-get', APT_GET);
    process.env.HAS_LISTS = '1';
    try {
      await ensureSystemPackages(machine({ dirs: [bin] }), () => undefined);
    } finally {
      delete process.env.HAS_LISTS;
    }
    expect(await calls()).toEqual([
      `DEBIAN_FRONTEND=noninteractive install -y -qq ${LOCK} redis-server pgbouncer`,
    ]);
  });

  it('stops with one line, and installs nothing, when it may not install', async () => {
    await executable(bin, 'apt-get', APT_GET);
    const said: string[] = [];
    const stopped = ensureSystemPackages(machine({ dirs: [empty, bin], root: false }), (line) =>
      said.push(line),
    );
    const error = (await stopped.catch((caught: unknown) => caught)) as Error;
    expect(error).toBeInstanceOf(SystemPackagesMissing);
    // Jest prints a failed global setup's stack: it is the one line, nothing under it.
    expect(error.stack).toBe(error.message);
    expect(error.message).not.toContain('\n');
    expect(error.message).toContain('run `sudo apt-get install -y redis-server pgbouncer`');
    expect(said).toEqual([]);
    await expect(readFile(join(bin, 'calls.log'), 'utf8')).rejects.toThrow('ENOENT');
  });

  it('stops naming what apt-get said when the install fails even after an update', async () => {
    await executable(
      bin,
      'apt-get',
      '#!/bin/sh\necho "E: Could not get lock /var/lib/dpkg/lock-frontend"\nexit 100\n',
    );
    await expect(ensureSystemPackages(machine({ dirs: [empty, bin] }), () => undefined)).rejects.toThrow(
      'Test set-up: apt-get install -y redis-server pgbouncer did not install redis-server and pgbouncer: ' +
        'apt-get update exited with 100: E: Could not get lock /var/lib/dpkg/lock-frontend',
    );
  });
});
