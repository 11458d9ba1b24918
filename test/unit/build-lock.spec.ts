import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from '@jest/globals';
import { holdBuildLock, type BuildLockHolder } from '../support/build-lock-holder.js';

/**
 * The build lock (scripts/build-lock.mjs) that lets one build of a checkout run at a time, taken
 * by real processes. Each test has a lock address of its own, so none of them touches the lock of
 * this checkout's own builds. Both kinds: the abstract socket Linux uses, and the socket file other
 * systems use, which a killed holder leaves behind.
 */
const ADDRESSES = {
  abstract: () => `\0build-lock-test-${randomUUID()}`,
  'socket file': () => join(tmpdir(), `build-lock-test-${randomUUID()}.sock`),
};

describe.each(Object.keys(ADDRESSES) as (keyof typeof ADDRESSES)[])('build lock (%s)', (kind) => {
  const holders: BuildLockHolder[] = [];
  const addresses = new Set<string>();
  const hold = (address: string) => {
    const holder = holdBuildLock(process.cwd(), address);
    holders.push(holder);
    addresses.add(address);
    return holder;
  };

  afterEach(async () => {
    await Promise.all(holders.splice(0).map((holder) => holder.kill()));
    // A holder killed here leaves its socket file behind.
    const files = [...addresses].filter((address) => !address.startsWith('\0'));
    addresses.clear();
    await Promise.all(files.map((file) => rm(file, { force: true })));
  });

  it('lets one process at a time hold it: a second waits, told who holds it, and takes it on release', async () => {
    const address = ADDRESSES[kind]();
    const first = hold(address);
    await first.held();
    const second = hold(address);
    expect(await second.waiting()).toBe(first.pid);
    // The first still holds it, so the second cannot have it.
    expect(second.output()).not.toContain('held');

    expect(await first.release()).toBe(0);
    await second.held();
    expect(await second.release()).toBe(0);
    expect(second.output().trim().split('\n')).toEqual([`waiting ${first.pid}`, 'held', 'released']);
    // A released lock leaves nothing behind: no file for the next build to judge.
    expect(existsSync(address)).toBe(false);
  });

  it('is free the moment its holder is SIGKILLed: a waiting process takes it', async () => {
    const address = ADDRESSES[kind]();
    const first = hold(address);
    await first.held();
    const second = hold(address);
    expect(await second.waiting()).toBe(first.pid);

    await first.kill();
    await second.held();
    expect(first.output()).not.toContain('released');
  });

  it('is taken by the next process after a SIGKILLed holder, with no one waiting at the time', async () => {
    const address = ADDRESSES[kind]();
    const first = hold(address);
    await first.held();
    await first.kill();
    // A socket file outlives its killed process (an abstract name does not exist without one).
    expect(existsSync(address)).toBe(kind === 'socket file');

    const next = hold(address);
    await next.held();
    expect(next.output()).not.toContain('waiting');
    expect(await next.release()).toBe(0);
    expect(existsSync(address)).toBe(false);
  });
});

describe('build lock address', () => {
  const addressOf = (checkout: string, platform: string) =>
    execFileSync(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `const { buildLockAddress } = await import('./scripts/build-lock.mjs');
         console.log(JSON.stringify(buildLockAddress(process.argv[1], process.argv[2])));`,
        checkout,
        platform,
      ],
      { encoding: 'utf8', env: { ...process.env, NODE_OPTIONS: '' } },
    );

  it('is one per checkout: abstract on Linux, a socket file in the temporary directory elsewhere', () => {
    const here = JSON.parse(addressOf('.', 'linux'));
    const there = JSON.parse(addressOf(tmpdir(), 'linux'));
    expect(here).toMatch(/^\0nest-idempotent-webhooks-build-[0-9a-f]{16}$/);
    expect(there).not.toBe(here);
    // The same checkout by another path (absolute here) is the same lock.
    expect(JSON.parse(addressOf(process.cwd(), 'linux'))).toBe(here);
    expect(JSON.parse(addressOf('.', 'darwin'))).toBe(join(tmpdir(), `${here.slice(1)}.sock`));
  });
});
