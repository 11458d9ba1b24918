import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import {
  AbortedTransactionFixtureModule,
  Aborts,
  INNER_SCOPE,
} from '../fixtures/aborted-transaction.fixture.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/**
 * A handler that catches a failed statement and returns normally: PostgreSQL has aborted its
 * transaction, so its COMMIT cannot write anything. Whichever way the COMMIT is sent (alone, with
 * the claim's own insert as request mode sends it, with a statement the handler gave it), the
 * answer is docs/modes.md's: 500 TransactionAbortedError, not a 503 "may have committed"; nothing
 * is written or stored, and a retry runs the handler again.
 */
describe.each(ADAPTERS)('a handler that goes on after a failed statement (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let aborts: Aborts;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [AbortedTransactionFixtureModule.forDatabase(db.url)]);
    aborts = running.app.get(Aborts);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const calls = (id: string) => db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [id]);
  const claimRows = async (key: string) =>
    (
      await db.pool.query(
        'SELECT status, response FROM processed_events WHERE event_key = $1 AND scope <> $2',
        [key, INNER_SCOPE],
      )
    ).rows;

  it('request mode (the COMMIT inserts the claim): 500 problem details, nothing stored, the retry runs', async () => {
    const id = `ord_aborted_request_${adapter}`;
    const key = `8e03978e-aborted-${adapter}`;
    const pay = () =>
      request(running.url).post('/aborted/request').set('Idempotency-Key', `"${key}"`).send({ id });
    aborts.ids.add(id);

    const aborted = await pay();
    expect(aborted.status).toBe(500);
    expect(aborted.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(aborted.body.code).toBe('IDEMPOTENCY_TRANSACTION_ABORTED');
    expect(aborted.headers['retry-after']).toBeUndefined();
    expect(await orders(id)).toBe(0);
    // Recorded failed (for the reporter), with no response for a retry to replay.
    expect(await claimRows(key)).toEqual([{ status: 'failed', response: null }]);

    aborts.ids.delete(id);
    const retried = await pay();
    expect(retried.status).toBe(201);
    expect(retried.headers['idempotent-replayed']).toBeUndefined();
    expect(retried.body).toEqual({ id });
    expect(aborts.runs.get(id)).toBe(2);
    expect(await orders(id)).toBe(1);
    expect(await claimRows(key)).toEqual([{ status: 'done', response: expect.anything() }]);
  });

  it.each([
    ['its COMMIT alone', 'webhook'],
    ['a statement sent with its COMMIT', 'webhook-deferred'],
  ])(
    'a transaction-mode webhook with %s: 500, nothing written, the redelivery runs',
    async (_what, route) => {
      const id = `evt_aborted_${route}_${adapter}`;
      const deliver = () => request(running.url).post(`/aborted/${route}`).send({ id });
      aborts.ids.add(id);

      const aborted = await deliver();
      expect(aborted.status).toBe(500);
      expect(aborted.body.message).toContain('a statement in its transaction failed');
      expect(await orders(id)).toBe(0);
      expect(await calls(id)).toBe(0);
      expect(await claimRows(id)).toEqual([{ status: 'failed', response: null }]);

      aborts.ids.delete(id);
      const redelivered = await deliver();
      expect(redelivered.status).toBe(200);
      expect(redelivered.headers['idempotent-replayed']).toBeUndefined();
      expect(aborts.runs.get(id)).toBe(2);
      expect(await orders(id)).toBe(1);
      expect(await calls(id)).toBe(route === 'webhook-deferred' ? 1 : 0);
      expect(await claimRows(id)).toEqual([{ status: 'done', response: null }]);
    },
  );
});
