import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, isAbsolute, join } from 'node:path';
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

/** Where the sample said it keeps its data: `Running on <url> (data in <dir>)`. */
function dataDirOf(output: string, cwd: string): string {
  const shown = /\(data in (.+?)\)/.exec(output)?.[1];
  if (!shown) throw new Error(`the sample did not say where its data is:\n${output}`);
  return isAbsolute(shown) ? shown : join(cwd, shown);
}

/**
 * The newcomer's path: no DATABASE_URL, no FULFILMENT_URL. The sample runs its own PostgreSQL
 * under `.data/` of its working directory (a scratch directory here, the repository root under
 * `npm run sample`), keeps it across restarts, and stops it when it stops. The working directory
 * is private (0700, as `mktemp -d` makes it): as root, where Postgres runs as the `postgres` user
 * that cannot get in, the data goes to a directory of its own under the temporary directory, the
 * same one on every start, and the log says so; nothing is chmod'ed.
 */
describe('Stripe sample: embedded PostgreSQL', () => {
  let cwd: string;
  let dataDir: string | undefined;

  beforeAll(async () => {
    cwd = await mkdtemp(join(tmpdir(), 'stripe-sample-'));
  });

  afterAll(async () => {
    await killAllSamples();
    await rm(cwd, { recursive: true, force: true });
    // As root the data lived outside cwd.
    if (dataDir && !dataDir.startsWith(cwd)) await rm(dirname(dataDir), { recursive: true, force: true });
  });

  const postmasterPid = async () =>
    Number((await readFile(join(dataDir!, 'postmaster.pid'), 'utf8')).split('\n')[0]);

  it('starts PostgreSQL under .data/, keeps processed events across restarts, and stops it on SIGTERM', async () => {
    const event = checkoutSessionCompleted('evt_embedded');

    const first = await startSample({ cwd });
    dataDir = dataDirOf(first.output(), cwd);
    if (process.getuid?.() === 0) {
      expect(first.output()).toContain(
        `${cwd} (mode 0700, owner root) does not let the "postgres" user through to .data/postgres: keeping the data in ${dataDir} instead`,
      );
      expect(first.output()).toContain(`Initialising ${dataDir} (first run only)`);
      expect((await stat(cwd)).mode & 0o777).toBe(0o700);
    } else {
      expect(dataDir).toBe(join(cwd, '.data/postgres'));
      expect(first.output()).toContain('Initialising .data/postgres (first run only)');
    }
    const answer = await deliver(first.url, FULFILMENT, event);
    expect(answer.status).toBe(200);
    // FULFILMENT_URL unset: the fulfilment is logged, not sent.
    expect(answer.body.effect).toBe('fulfilment_logged');
    expect(first.output()).toContain('FULFILMENT_URL is not set: would fulfil {"eventId":"evt_embedded"');
    const firstServer = await postmasterPid();
    expect(alive(firstServer)).toBe(true);
    expect(await first.terminate()).toEqual({ code: 0, signal: null });
    expect(alive(firstServer)).toBe(false);
    expect(existsSync(join(dataDir, 'postmaster.pid'))).toBe(false);

    const second = await startSample({ cwd });
    expect(dataDirOf(second.output(), cwd)).toBe(dataDir);
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
