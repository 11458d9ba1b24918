import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, lockWaiters, type TestDatabase } from '../support/database.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { waitUntil } from '../support/wait-until.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';

/** A bound short enough that a duplicate storm gives its connections back quickly. */
const SHORT_WAIT_MS = 200;
/** Long enough for later duplicates to arrive while the first still waits in Postgres. */
const MEDIUM_WAIT_MS = 1_000;
/** A bound no test reaches: the first delivery's commit or rollback ends the wait. */
const LONG_WAIT_MS = 30_000;
const POOL_SIZE = 10;

/**
 * A concurrent duplicate in transaction mode blocks on the first delivery's uncommitted claim for
 * at most `concurrentDuplicateWaitMs`, then answers 409 + Retry-After, so a storm of duplicates of
 * one held event cannot hold the pool and starve unrelated events.
 */
describe.each(onAdapter('fastify'))('bounded wait for concurrent duplicates (%s)', (adapter) => {
  let db: TestDatabase;
  let short: RunningApp;
  let long: RunningApp;
  /** Second replicas on the same database: their duplicates wait in Postgres, not in process. */
  let replica: RunningApp;
  let shortReplica: RunningApp;
  let medium: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    const startWith = (concurrentDuplicateWaitMs: number) =>
      startApp(adapter, [
        WebhookFixtureModule.forDatabase({
          databaseUrl: db.url,
          poolSize: POOL_SIZE,
          idempotency: { concurrentDuplicateWaitMs },
        }),
      ]);
    short = await startWith(SHORT_WAIT_MS);
    long = await startWith(LONG_WAIT_MS);
    replica = await startWith(LONG_WAIT_MS);
    shortReplica = await startWith(SHORT_WAIT_MS);
    medium = await startWith(MEDIUM_WAIT_MS);
  });

  afterAll(async () => {
    await medium?.close();
    await shortReplica?.close();
    await short?.close();
    await long?.close();
    await replica?.close();
    await db?.drop();
  });

  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  // Claims that committed: a handler's failure leaves a failed record, which claims nothing.
  const claims = (id: string) =>
    db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [id]);
  /** Starts a delivery without awaiting it (supertest only sends once `then` is called). */
  const deliver = (running: RunningApp, event: Record<string, unknown>) =>
    request(running.url)
      .post('/orders')
      .send(event)
      .then((answer) => answer);

  it('answers duplicates of a held claim 409 + Retry-After after the bound, while unrelated events complete', async () => {
    const id = `evt_held_${adapter}`;
    const { answer: held, gates } = await parkDelivery(short, '/orders', { id });

    // More duplicates than the pool has free connections, plus unrelated events behind them.
    const duplicates = Array.from({ length: 12 }, () => deliver(short, { id }));
    const unrelatedIds = Array.from({ length: 5 }, (_, n) => `evt_unrelated_${adapter}_${n}`);
    const unrelated = unrelatedIds.map((other) => deliver(short, { id: other }));

    const unrelatedAnswers = await Promise.all(unrelated);
    expect(unrelatedAnswers.map((answer) => answer.status)).toEqual(unrelatedIds.map(() => 200));
    for (const other of unrelatedIds) expect(await orders(other)).toBe(1);

    const duplicateAnswers = await Promise.all(duplicates);
    for (const answer of duplicateAnswers) {
      expect(answer.status).toBe(409);
      expect(answer.headers['retry-after']).toMatch(/^[1-9]\d*$/);
      expect(answer.body.message).toBe(`Event ${id} is being processed by another delivery; retry later`);
    }
    // The held delivery is still parked: nothing the duplicates did committed.
    expect(await orders(id)).toBe(0);
    expect(await claims(id)).toBe(0);

    gates.open(id);
    const first = await held;
    expect(first.status).toBe(200);
    expect(first.body).toEqual({ processed: id });
    expect(await orders(id)).toBe(1);
    expect(await claims(id)).toBe(1);

    const retried = await deliver(short, { id });
    expect(retried.status).toBe(200);
    expect(retried.headers['idempotent-replayed']).toBe('true');
    expect(await orders(id)).toBe(1);
  });

  it('also bounds duplicates that arrive at another replica, which wait in Postgres', async () => {
    const id = `evt_replica_held_${adapter}`;
    const { answer: held, gates } = await parkDelivery(short, '/orders', { id });
    const answers = await Promise.all(Array.from({ length: 12 }, () => deliver(shortReplica, { id })));
    for (const answer of answers) {
      expect(answer.status).toBe(409);
      expect(answer.headers['retry-after']).toMatch(/^[1-9]\d*$/);
    }
    expect(await claims(id)).toBe(0);
    gates.open(id);
    expect((await held).status).toBe(200);
    expect(await orders(id)).toBe(1);
  });

  it('keeps same-process duplicates off the pool: more duplicates than connections leave room for unrelated events', async () => {
    const id = `evt_single_flight_${adapter}`;
    const { answer: held, gates } = await parkDelivery(long, '/orders', { id });

    // Three times the pool, each allowed to wait 30 s: waiting in Postgres they would hold every
    // connection until the held delivery ends, and the unrelated events below could not finish.
    const duplicates = Array.from({ length: POOL_SIZE * 3 }, () => deliver(long, { id }));
    const server = long.app.getHttpServer() as {
      getConnections(cb: (error: unknown, n: number) => void): void;
    };
    const connections = () => new Promise<number>((done) => server.getConnections((_error, n) => done(n)));
    await waitUntil(
      async () => (await connections()) >= POOL_SIZE * 3 + 1,
      'every duplicate to reach the app',
    );

    const unrelatedIds = Array.from({ length: 3 }, (_, n) => `evt_beside_storm_${adapter}_${n}`);
    const unrelated = await Promise.all(unrelatedIds.map((other) => deliver(long, { id: other })));
    expect(unrelated.map((answer) => answer.status)).toEqual([200, 200, 200]);
    for (const other of unrelatedIds) expect(await orders(other)).toBe(1);
    expect(await orders(id)).toBe(0); // still parked: the unrelated events did not wait for it

    gates.open(id);
    expect((await held).status).toBe(200);
    for (const answer of await Promise.all(duplicates)) {
      expect(answer.status).toBe(200);
      expect(answer.headers['idempotent-replayed']).toBe('true');
    }
    expect(await orders(id)).toBe(1);
    expect(await claims(id)).toBe(1);
  });

  it('never lets waiting duplicates stampede the row lock when the one ahead of them gives up', async () => {
    // The claim is held at another replica. This app's first duplicate waits on its row lock in
    // Postgres; the later ones wait in memory. When the first gives up (409), one waiter takes its
    // place and the rest keep waiting on that one: at most one session of this app on the lock.
    const id = `evt_no_stampede_${adapter}`;
    const { answer: held, gates } = await parkDelivery(short, '/orders', { id });
    const first = deliver(medium, { id });
    await waitUntil(async () => (await lockWaiters(db)) === 1, 'the first duplicate to wait on the lock');
    // The later ones arrive halfway through the first's wait, so they still have half their own
    // bound left when it gives up: the moment a stampede would start. (This delay places the
    // arrivals; it hides no race, the count below is taken throughout.)
    await new Promise((resolve) => setTimeout(resolve, MEDIUM_WAIT_MS / 2));
    let answered = false;
    const later = Promise.all(Array.from({ length: 6 }, () => deliver(medium, { id }))).finally(
      () => (answered = true),
    );
    let mostWaiters = 0;
    // Bounded, so an answer that never comes fails the test instead of spinning past it.
    const giveUpAt = Date.now() + 10 * MEDIUM_WAIT_MS;
    while (!answered && Date.now() < giveUpAt) mostWaiters = Math.max(mostWaiters, await lockWaiters(db));
    expect(answered).toBe(true);

    expect(mostWaiters).toBe(1);
    for (const answer of [await first, ...(await later)]) {
      expect(answer.status).toBe(409);
      expect(answer.headers['retry-after']).toMatch(/^[1-9]\d*$/);
    }
    expect(await claims(id)).toBe(0);
    gates.open(id);
    expect((await held).status).toBe(200);
    expect(await orders(id)).toBe(1);
  });

  it('answers duplicates 200 replayed when the first delivery commits within the bound', async () => {
    const id = `evt_commits_${adapter}`;
    const { answer: held, gates } = await parkDelivery(long, '/orders', { id });

    const duplicates = Array.from({ length: 5 }, () => deliver(replica, { id }));
    // The replica sends one of them to Postgres; the other four wait on that one in process.
    await waitUntil(async () => (await lockWaiters(db)) === 1, 'the replica to wait on the claim');
    gates.open(id);

    const first = await held;
    expect(first.status).toBe(200);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    for (const answer of await Promise.all(duplicates)) {
      expect(answer.status).toBe(200);
      expect(answer.headers['idempotent-replayed']).toBe('true');
    }
    expect(await orders(id)).toBe(1);
    expect(await claims(id)).toBe(1);
  });

  it('lets a waiting duplicate claim and run when the first delivery rolls back', async () => {
    const id = `evt_rolls_back_${adapter}`;
    const { answer: held, gates } = await parkDelivery(long, '/orders', { id, fail: true });

    const duplicate = deliver(replica, { id });
    await waitUntil(async () => (await lockWaiters(db)) === 1, 'the duplicate to wait on the claim');
    gates.open(id);

    expect((await held).status).toBe(500);
    const answer = await duplicate;
    expect(answer.status).toBe(200);
    expect(answer.body).toEqual({ processed: id });
    expect(answer.headers['idempotent-replayed']).toBeUndefined();
    expect(await orders(id)).toBe(1);
    expect(await claims(id)).toBe(1);
  });
});
