import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { onAdapter } from '../support/app.js';
import { startChildApp, type ChildApp } from '../support/child-app.js';
import { createTestDatabase, lockWaiters, openTransactions, type TestDatabase } from '../support/database.js';
import { waitUntil } from '../support/wait-until.js';

/**
 * The seed's crash test, for real: the handler is parked inside its transaction after the claim,
 * the process is SIGKILLed (no shutdown hook, no rollback from Node), and a new process gets the
 * redelivery. The claim must not outlive the crash, and the effect must happen exactly once.
 */
describe.each(onAdapter('express'))('crash between claim and commit (%s)', (adapter) => {
  let db: TestDatabase;
  const children: ChildApp[] = [];

  const start = async (concurrentDuplicateWaitMs?: number) => {
    const child = await startChildApp(adapter, {
      databaseUrl: db.url,
      idempotency: { concurrentDuplicateWaitMs },
    });
    children.push(child);
    return child;
  };
  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  // Claims that committed: a handler's failure leaves a failed record, which claims nothing.
  const claims = (id: string) =>
    db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [id]);

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterEach(async () => {
    await Promise.all(children.splice(0).map((child) => child.stop()));
  });

  afterAll(async () => {
    await db?.drop();
  });

  /**
   * Sends a delivery that parks inside its transaction. The request dies with the child: its
   * outcome is the socket error, not an answer.
   */
  const parkUntilKilled = (child: ChildApp, id: string) =>
    request(child.url)
      .post('/orders')
      .send({ id, block: true })
      .then(
        (answer) => answer.status,
        () => 'connection lost',
      );

  it('rolls the claim back when the process dies, and the redelivery to a new process runs once', async () => {
    const id = `evt_crash_${adapter}`;
    const doomed = await start();
    const lost = parkUntilKilled(doomed, id);
    await doomed.entered(id);
    // The claim and the order exist, uncommitted, inside the parked transaction.
    await doomed.kill();
    expect(await lost).toBe('connection lost');

    // Postgres ends the dead client's backend and rolls its transaction back.
    await waitUntil(
      async () => (await openTransactions(db)) === 0,
      'the transaction of the killed child to end',
    );
    expect(await orders(id)).toBe(0);
    expect(await claims(id)).toBe(0);

    const survivor = await start();
    const redelivered = await request(survivor.url).post('/orders').send({ id });
    expect(redelivered.status).toBe(200);
    expect(redelivered.body).toEqual({ processed: id });
    expect(redelivered.headers['idempotent-replayed']).toBeUndefined();
    expect(await orders(id)).toBe(1);
    expect(await claims(id)).toBe(1);

    const again = await request(survivor.url).post('/orders').send({ id });
    expect(again.status).toBe(200);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(await orders(id)).toBe(1);
    expect(await claims(id)).toBe(1);
  });

  it('hands a redelivery already waiting on the claim to the rollback when the process dies', async () => {
    const id = `evt_crash_race_${adapter}`;
    const doomed = await start();
    // A bound far above the kill's latency: the wait must end with the rollback, not the bound.
    const survivor = await start(30_000);
    const lost = parkUntilKilled(doomed, id);
    await doomed.entered(id);
    // Once the redelivery waits on the parked claim's row lock, the kill must hand it the
    // rollback (it claims and runs), not a done claim.
    const redelivered = request(survivor.url)
      .post('/orders')
      .send({ id })
      .then((answer) => answer);
    await waitUntil(async () => (await lockWaiters(db)) === 1, 'the redelivery to wait on the claim');
    await doomed.kill();
    expect(await lost).toBe('connection lost');

    const answer = await redelivered;
    expect(answer.status).toBe(200);
    expect(answer.body).toEqual({ processed: id });
    expect(answer.headers['idempotent-replayed']).toBeUndefined();
    expect(await orders(id)).toBe(1);
    expect(await claims(id)).toBe(1);
  });
});
