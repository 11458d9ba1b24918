import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { startApp, type AdapterName, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { pgBouncerPerFile, routeUrl, type Route } from '../support/database-routes.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';

const pooler = pgBouncerPerFile();

/**
 * The default mode's answers (200, the replayed header) on both platforms, directly; behind the
 * pooler once, on one platform: it changes what the database sees, not what HTTP answers (see
 * test/support/app.ts). External mode's pooler route runs on the other platform.
 */
const SETUPS: [Route, AdapterName][] = [
  ['direct', 'express'],
  ['direct', 'fastify'],
  ['pgbouncer', 'fastify'],
];

describe.each(SETUPS)('transaction mode (%s, %s)', (route, adapter) => {
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    // Default options: behind the pooler the library has to cope on its own.
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({ databaseUrl: routeUrl(route, db, pooler) }),
    ]);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  // Claims that committed: a handler's failure leaves a failed record, which claims nothing.
  const claims = (id: string) =>
    db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [id]);
  const claimRows = async (id: string) =>
    (
      await db.pool.query('SELECT status, attempts, last_error FROM processed_events WHERE event_key = $1', [
        id,
      ])
    ).rows;

  it('processes a delivery once and replays the duplicate without calling the handler', async () => {
    const first = await request(running.url).post('/orders').send({ id: 'evt_seq_1', amount: 42 });
    expect(first.status).toBe(200);
    expect(first.body).toEqual({ processed: 'evt_seq_1' });
    expect(first.headers['idempotent-replayed']).toBeUndefined();

    const second = await request(running.url).post('/orders').send({ id: 'evt_seq_1', amount: 42 });
    expect(second.status).toBe(200);
    expect(second.headers['idempotent-replayed']).toBe('true');

    expect(await orders('evt_seq_1')).toBe(1);
    const { rows } = await db.pool.query(
      'SELECT scope, source, status FROM processed_events WHERE event_key = $1',
      ['evt_seq_1'],
    );
    expect(rows).toEqual([{ scope: 'FixtureController.order', source: 'fixture', status: 'done' }]);
  });

  it('runs 50 concurrent deliveries of one event exactly once, with no 5xx', async () => {
    const answers = await Promise.all(
      Array.from({ length: 50 }, () =>
        request(running.url).post('/orders').send({ id: 'evt_burst', amount: 7 }),
      ),
    );
    const statuses = answers.map((answer) => answer.status);
    expect(statuses.filter((status) => status >= 500)).toEqual([]);
    expect(statuses.every((status) => status === 200 || status === 409)).toBe(true);
    expect(
      answers.filter((answer) => answer.status === 200 && !answer.headers['idempotent-replayed']),
    ).toHaveLength(1);
    expect(await orders('evt_burst')).toBe(1);
    expect(await claims('evt_burst')).toBe(1);
  });

  it('rolls back claim and effect when the handler throws, so the redelivery runs it', async () => {
    const failed = await request(running.url).post('/orders').send({ id: 'evt_fail', fail: true });
    expect(failed.status).toBe(500);
    expect(await orders('evt_fail')).toBe(0);
    expect(await claims('evt_fail')).toBe(0);
    // The failure is recorded outside the rolled-back transaction, for the poison report.
    expect(await claimRows('evt_fail')).toEqual([
      { status: 'failed', attempts: 1, last_error: 'handler failed on purpose' },
    ]);

    const retried = await request(running.url).post('/orders').send({ id: 'evt_fail' });
    expect(retried.status).toBe(200);
    expect(retried.headers['idempotent-replayed']).toBeUndefined();
    expect(await orders('evt_fail')).toBe(1);
    expect(await claimRows('evt_fail')).toEqual([{ status: 'done', attempts: 2, last_error: null }]);

    const replayed = await request(running.url).post('/orders').send({ id: 'evt_fail' });
    expect(replayed.headers['idempotent-replayed']).toBe('true');
    expect(await orders('evt_fail')).toBe(1);
  });

  it('counts every failed delivery of an event that always fails, and its redeliveries keep running', async () => {
    for (let attempt = 1; attempt <= 3; attempt++) {
      const answer = await request(running.url).post('/orders').send({ id: 'evt_poison', fail: true });
      expect(answer.status).toBe(500);
      expect(await claimRows('evt_poison')).toEqual([
        { status: 'failed', attempts: attempt, last_error: 'handler failed on purpose' },
      ]);
    }
    expect(await orders('evt_poison')).toBe(0);
  });

  it('gives services the transaction through IdempotencyContext', async () => {
    const failed = await request(running.url).post('/orders/via-service').send({ id: 'evt_svc', fail: true });
    expect(failed.status).toBe(500);
    expect(await orders('evt_svc')).toBe(0);

    const ok = await request(running.url).post('/orders/via-service').send({ id: 'evt_svc' });
    expect(ok.status).toBe(200);
    expect(ok.body).toEqual({ processed: 'evt_svc', scope: 'FixtureController.viaService', key: 'evt_svc' });
    expect(await orders('evt_svc')).toBe(1);
  });

  it('processes one event once per handler: two scopes, two claims', async () => {
    await request(running.url).post('/orders').send({ id: 'evt_two_scopes' }).expect(200);
    const other = await request(running.url).post('/external').send({ id: 'evt_two_scopes' });
    expect(other.status).toBe(200);
    expect(other.headers['idempotent-replayed']).toBeUndefined();
    expect(await claims('evt_two_scopes')).toBe(2);
  });

  it('keeps unrelated events flowing while one claim is held', async () => {
    const { answer: held, gates } = await parkDelivery(running, '/orders', { id: 'evt_held' });
    await request(running.url).post('/orders').send({ id: 'evt_other' }).expect(200);
    expect(await orders('evt_other')).toBe(1);
    gates.open('evt_held');
    expect((await held).status).toBe(200);
    expect(await orders('evt_held')).toBe(1);
  });
});
