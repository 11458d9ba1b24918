import { resolve } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { ADAPTERS } from '../support/app.js';
import { startChildApp, type ChildApp } from '../support/child-app.js';
import { createTestDatabase, openTransactions, type TestDatabase } from '../support/database.js';
import { waitUntil } from '../support/wait-until.js';

const CHILD = resolve('dist/test/fixtures/idempotency-key-child.js');

/**
 * A request-mode route's stored response commits with its work or not at all: the process is
 * SIGKILLed after the handler's write and before the COMMIT (the handler parked at its gate), and
 * neither the order nor a claim with a response is left. The client's retry, to a new process,
 * runs the request once and stores its response once; the retry after that is replayed.
 */
describe.each(ADAPTERS)('request mode: SIGKILL between the work and its COMMIT (%s)', (adapter) => {
  let db: TestDatabase;
  const children: ChildApp[] = [];

  const start = async () => {
    const child = await startChildApp(adapter, { databaseUrl: db.url }, { entry: CHILD });
    children.push(child);
    return child;
  };
  const pay = (child: ChildApp, key: string, body: object) =>
    request(child.url)
      .post('/api/payments')
      .set('X-User', 'user_a')
      .set('Idempotency-Key', `"${key}"`)
      .send(body);
  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const claimRows = async (key: string) =>
    (
      await db.pool.query('SELECT status, response FROM processed_events WHERE event_key = $1', [
        `user_a:${key}`,
      ])
    ).rows;

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterEach(async () => {
    await Promise.all(children.splice(0).map((child) => child.stop()));
  });

  afterAll(async () => {
    await db?.drop();
  });

  it('leaves neither the effect nor a stored response, and the retry runs once and stores once', async () => {
    const id = `ord_crash_${adapter}`;
    const key = `8e03978e-crash-${adapter}`;
    const doomed = await start();
    const lost = pay(doomed, key, { id, amount: 500, block: true }).then(
      (answer) => answer.status,
      () => 'connection lost',
    );
    // The order row and the claim exist, uncommitted, in the parked transaction.
    await doomed.entered(id);
    await doomed.kill();
    expect(await lost).toBe('connection lost');
    await waitUntil(async () => (await openTransactions(db)) === 0, "the killed child's transaction to end");
    expect(await orders(id)).toBe(0);
    expect(await claimRows(key)).toEqual([]);

    const survivor = await start();
    // The same request without the gate (the crashed one left no claim to compare it with).
    const retry = await pay(survivor, key, { id, amount: 500 });
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBeUndefined();
    expect(await orders(id)).toBe(1);
    const [claim] = await claimRows(key);
    expect(claim).toEqual({
      status: 'done',
      response: {
        status: 201,
        // Location by the name the handler wrote it with (Fastify sends every name in lower case).
        headers: { [adapter === 'express' ? 'Location' : 'location']: retry.headers.location },
        json: retry.text,
      },
    });

    const again = await pay(survivor, key, { id, amount: 500 });
    expect(again.status).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toEqual(retry.body);
    expect(await orders(id)).toBe(1);
    expect(await claimRows(key)).toHaveLength(1);
  });
});
