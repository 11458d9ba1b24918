import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { AsyncLocalStorage } from 'node:async_hooks';
import pg from 'pg';
import { connectClient, sendQuery } from '../../lib/postgres/pg-promises.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { freePort } from '../support/postgres-server.js';

/**
 * pg's calls on the claim path, each one promise over pg's callbacks: pg's answers and errors (with
 * their SQLSTATEs), and what follows each runs in the awaiting delivery's async context, even
 * when the connection was handed over by another delivery's release (pg-pool then calls back from
 * inside that release).
 */
describe('pg calls as one promise each', () => {
  let db: TestDatabase;
  let pool: pg.Pool;
  const delivery = new AsyncLocalStorage<string>();

  beforeAll(async () => {
    db = await createTestDatabase();
    pool = new pg.Pool({ connectionString: db.url, max: 1 });
    pool.on('error', () => undefined); // an idle client's error is reported by its next query
  });

  afterAll(async () => {
    await pool.end();
    await db.drop();
  });

  it('answers a simple query with one result per statement, and a statement error with its SQLSTATE', async () => {
    const client = await connectClient(pool);
    try {
      const answer = (await sendQuery(
        client,
        'SELECT 1 AS one; SELECT 2 AS two',
      )) as unknown as pg.QueryResult[];
      expect(answer.map((result) => result.rows[0])).toEqual([{ one: 1 }, { two: 2 }]);
      await expect(sendQuery(client, 'SELECT * FROM no_such_table')).rejects.toMatchObject({
        code: '42P01',
      });
      // The connection is still usable: the failed statement ended its own implicit transaction.
      expect((await sendQuery(client, 'SELECT 3 AS three')).rows).toEqual([{ three: 3 }]);
    } finally {
      client.release();
    }
  });

  it('answers a pool query with values and gives the connection back; an error comes with its SQLSTATE, its connection dropped', async () => {
    const { rows } = await sendQuery(pool, { text: 'SELECT $1::int + 1 AS n', values: [41] });
    expect(rows).toEqual([{ n: 42 }]);
    expect({ total: pool.totalCount, idle: pool.idleCount }).toEqual({ total: 1, idle: 1 });
    await expect(sendQuery(pool, { text: 'SELECT $1::int', values: ['x'] })).rejects.toMatchObject({
      code: '22P02',
    });
    // pg-pool drops a connection whose query failed, as its promise form does.
    expect({ total: pool.totalCount, waiting: pool.waitingCount }).toEqual({ total: 0, waiting: 0 });
  });

  it("rejects with the pool's error when the server cannot be reached", async () => {
    const unreachable = new pg.Pool({
      host: '127.0.0.1',
      port: await freePort(),
      connectionTimeoutMillis: 5000,
    });
    try {
      await expect(connectClient(unreachable)).rejects.toMatchObject({ code: 'ECONNREFUSED' });
    } finally {
      await unreachable.end();
    }
  });

  it("keeps each awaiting delivery's context, when its connection comes from another delivery's release", async () => {
    const first = await delivery.run('first', () => connectClient(pool));
    let released = false;
    const release = () => {
      if (!released) delivery.run('first', () => first.release());
      released = true;
    };
    // The pool's one connection is taken: the second waits, and is called back from first's release.
    const second = delivery.run('second', async () => {
      const client = await connectClient(pool);
      const afterConnect = delivery.getStore();
      const answer = await sendQuery(client, 'SELECT 1 AS one');
      const afterQuery = delivery.getStore();
      client.release();
      const pooled = await sendQuery(pool, { text: 'SELECT 2 AS two' });
      return {
        afterConnect,
        afterQuery,
        afterPoolQuery: delivery.getStore(),
        rows: [answer.rows, pooled.rows],
      };
    });
    try {
      expect(pool.waitingCount).toBe(1);
    } finally {
      release(); // never left held, or the pool's end() would wait for it
    }
    await expect(second).resolves.toEqual({
      afterConnect: 'second',
      afterQuery: 'second',
      afterPoolQuery: 'second',
      rows: [[{ one: 1 }], [{ two: 2 }]],
    });
  });
});
