import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { killAllSamples, startSample } from '../support/sample-process.js';
import { checkoutSessionCompleted, deliver, FULFILMENT } from '../support/sample-stripe.js';

/** True while a process with `pid` exists (EPERM: it does, owned by another user). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * The newcomer's path: no DATABASE_URL, no FULFILMENT_URL. The sample runs its own PostgreSQL
 * under `.data/` of its working directory (a scratch directory here, the repository root under
 * `npm run sample`), keeps it across restarts, and stops it when it stops.
 */
describe('Stripe sample: embedded PostgreSQL', () => {
  let cwd: string;

  beforeAll(async () => {
    cwd = await mkdtemp(join(tmpdir(), 'stripe-sample-'));
    // As root, Postgres runs as the `postgres` user, which must be able to reach `.data/`.
    await chmod(cwd, 0o755);
  });

  afterAll(async () => {
    await killAllSamples();
    await rm(cwd, { recursive: true, force: true });
  });

  const postmasterPid = async () =>
    Number((await readFile(join(cwd, '.data/postgres/postmaster.pid'), 'utf8')).split('\n')[0]);

  it('starts PostgreSQL under .data/, keeps processed events across restarts, and stops it on SIGTERM', async () => {
    const event = checkoutSessionCompleted('evt_embedded');

    const first = await startSample({ cwd });
    expect(first.output()).toContain('Initialising .data/postgres');
    const answer = await deliver(first.url, FULFILMENT, event);
    expect(answer.status).toBe(200);
    // FULFILMENT_URL unset: the fulfilment is logged, not sent.
    expect(answer.body.effect).toBe('fulfilment_logged');
    expect(first.output()).toContain('FULFILMENT_URL is not set: would fulfil {"eventId":"evt_embedded"');
    const firstServer = await postmasterPid();
    expect(alive(firstServer)).toBe(true);
    expect(await first.terminate()).toEqual({ code: 0, signal: null });
    expect(alive(firstServer)).toBe(false);
    expect(existsSync(join(cwd, '.data/postgres/postmaster.pid'))).toBe(false);

    const second = await startSample({ cwd });
    expect(second.output()).not.toContain('Initialising');
    expect(second.output()).toContain('Schema up to date');
    const replay = await deliver(second.url, FULFILMENT, event);
    expect(replay.status).toBe(200);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    const secondServer = await postmasterPid();
    expect(await second.terminate()).toEqual({ code: 0, signal: null });
    expect(alive(secondServer)).toBe(false);
  });
});
