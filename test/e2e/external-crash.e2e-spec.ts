import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { onAdapter } from '../support/app.js';
import { startChildApp, type ChildApp } from '../support/child-app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls } from '../support/lease-rows.js';

/** Short, so the test waits about this long for the dead worker's lease; long enough to see 409s first. */
const LEASE_MS = 2_000;
const RETRY_AFTER_CAP = 30;
const EXTERNAL = 'FixtureController.external';
/** Redeliveries per round while polling: a re-claim race between them must still run the work once. */
const BURST = 5;

describe.each(onAdapter('fastify'))('external mode crash (%s)', (adapter) => {
  let db: TestDatabase;
  const children: ChildApp[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterEach(async () => {
    await Promise.all(children.splice(0).map((child) => child.kill()));
  });

  afterAll(async () => {
    await db?.drop();
  });

  const start = async () => {
    const child = await startChildApp(adapter, {
      databaseUrl: db.url,
      idempotency: { leaseMs: LEASE_MS, retryAfterSeconds: RETRY_AFTER_CAP },
    });
    children.push(child);
    return child;
  };

  it('keeps a dead worker’s lease until it expires, then one redelivery re-claims and completes', async () => {
    const id = `evt_crash_${adapter}`;
    // The survivor is up before the crash, so its first answers come while the lease is still live.
    const [doomed, survivor] = await Promise.all([start(), start()]);

    const lost = request(doomed.url)
      .post('/external')
      .send({ id, block: true })
      .then(
        () => 'answered',
        () => 'connection lost',
      );
    await doomed.entered(id);
    await doomed.kill();
    expect(await lost).toBe('connection lost');

    const dead = await claimRow(db, EXTERNAL, id);
    expect(dead).toMatchObject({ status: 'in_progress', attempts: 1 });

    // Redeliver in bursts until one is processed: every answer before that must be a 409 with a
    // lease-derived Retry-After, and the re-claim must not predate the dead lease's expiry.
    let inFlight = 0;
    let processed: request.Response | undefined;
    const deadline = Date.now() + 20_000;
    while (!processed) {
      expect(Date.now()).toBeLessThan(deadline);
      const answers = await Promise.all(
        Array.from({ length: BURST }, () => request(survivor.url).post('/external').send({ id })),
      );
      for (const answer of answers) {
        if (answer.status === 409) {
          inFlight++;
          const retryAfter = Number(answer.headers['retry-after']);
          expect(retryAfter).toBeGreaterThanOrEqual(1);
          expect(retryAfter).toBeLessThanOrEqual(Math.ceil(LEASE_MS / 1000));
          continue;
        }
        expect(answer.status).toBe(200);
        if (answer.headers['idempotent-replayed']) continue; // the re-claimer finished within the burst
        expect(processed).toBeUndefined(); // one re-claim, however many raced for it
        processed = answer;
      }
      if (!processed) await new Promise((resolve) => setTimeout(resolve, 100)); // poll, not spin
    }
    expect(inFlight).toBeGreaterThan(0);
    expect(processed.body).toEqual({ processed: id, attempt: 2 });

    const reclaimed = await claimRow(db, EXTERNAL, id);
    expect(reclaimed).toMatchObject({ status: 'done', attempts: 2 });
    expect(reclaimed?.lease_token).not.toBe(dead?.lease_token);
    expect(reclaimed!.claimed_at).toBeGreaterThanOrEqual(dead!.lease_expires_at!);

    const replays = await Promise.all(
      Array.from({ length: 3 }, () => request(survivor.url).post('/external').send({ id })),
    );
    expect(replays.map((answer) => [answer.status, answer.headers['idempotent-replayed']])).toEqual(
      Array(3).fill([200, 'true']),
    );
    // The killed worker was parked before its call: the side effect ran once, on attempt 2.
    expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }]);
  });
});
