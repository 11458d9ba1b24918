import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import type { ClsHandoff, ClsMount } from '../fixtures/cls-transactional.fixture.js';
import type { AdapterName } from '../support/app.js';
import { startChildApp, type ChildApp } from '../support/child-app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/** Every place ClsModule can set up its context, on Express; the usual one and none on Fastify. */
const SETUPS: [AdapterName, ClsMount][] = [
  ['express', 'middleware'],
  ['express', 'interceptor'],
  ['express', 'guard'],
  ['express', 'none'],
  ['fastify', 'middleware'],
  ['fastify', 'none'],
];

/** The app runs in plain Node (see the child's own comment): Jest cannot load the plugin. */
const CHILD = resolve('dist/test/fixtures/cls-transactional-child.js');

/**
 * `@Transactional()` services of @nestjs-cls/transactional (TypeORM adapter), called from a
 * transaction-mode handler, write in the claim's transaction: a rollback of the claim takes their
 * writes with it, and a commit commits both. Proven with the package itself, wherever the app's
 * ClsModule sets up its context (or nowhere).
 */
describe.each(SETUPS)('@Transactional() services in a claim (%s, ClsModule %s)', (adapter, mount) => {
  let db: TestDatabase;
  let running: ChildApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startChildApp(adapter, { databaseUrl: db.url, mount } as never, { entry: CHILD });
    // The bridge says so at boot when it found the plugin on the claims' DataSource.
    expect(running.output()).toContain(
      '@Transactional() services called from a transaction-mode handler join',
    );
  });

  afterAll(async () => {
    await running?.stop();
    await db?.drop();
  });

  const rows = (prefix: string) =>
    db.count(`SELECT count(*) FROM orders WHERE event_id LIKE $1`, [`${prefix}:%`]);
  const claim = async (id: string) =>
    (await db.pool.query('SELECT status, attempts FROM processed_events WHERE event_key = $1', [id])).rows;

  it('joins the claim: the same connection, and rolled back with it when the handler throws', async () => {
    const id = `evt_cls_joined_${adapter}_${mount}`;
    const failed = await request(running.url).post('/cls/joined').send({ id, fail: true });
    expect(failed.status).toBe(500);
    // The service's write went with the claim's rollback: the event can run again cleanly.
    expect(await rows(id)).toBe(0);
    expect(await claim(id)).toEqual([{ status: 'failed', attempts: 1 }]);

    const processed = await request(running.url).post('/cls/joined').send({ id });
    expect(processed.status).toBe(200);
    expect(processed.body.servicePid).toBe(processed.body.claimPid);
    expect(await rows(id)).toBe(1);
    expect(await claim(id)).toEqual([{ status: 'done', attempts: 2 }]);

    const replayed = await request(running.url).post('/cls/joined').send({ id });
    expect(replayed.headers['idempotent-replayed']).toBe('true');
    expect(await rows(id)).toBe(1);
  });

  it('lets Propagation.RequiresNew commit on a connection of its own, surviving the claim’s rollback', async () => {
    const id = `evt_cls_apart_${adapter}_${mount}`;
    const failed = await request(running.url).post('/cls/apart').send({ id, fail: true });
    expect(failed.status).toBe(500);
    expect(await rows(id)).toBe(1);
    const processed = await request(running.url).post('/cls/apart').send({ id });
    expect(processed.body.servicePid).not.toBe(processed.body.claimPid);
    // Run again with the redelivery: RequiresNew is not exactly-once, as documented.
    expect(await rows(id)).toBe(2);
  });

  it('runs Propagation.Nested as a savepoint of the claim: its failure undoes only itself', async () => {
    const kept = `evt_cls_nested_ok_${adapter}_${mount}`;
    expect((await request(running.url).post('/cls/nested').send({ id: kept })).body).toEqual({
      refused: false,
    });
    expect(await rows(kept)).toBe(2);

    const undone = `evt_cls_nested_fail_${adapter}_${mount}`;
    const answer = await request(running.url).post('/cls/nested').send({ id: undone, fail: true });
    expect(answer.body).toEqual({ refused: true });
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [`${undone}:outer`])).toBe(1);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [`${undone}:nested`])).toBe(0);
    expect(await claim(undone)).toEqual([{ status: 'done', attempts: 1 }]);
  });
});

/** The handoff app's queue and pg-boss schema. */
const HANDOFF: ClsHandoff = { schema: 'cls_jobs', queue: 'cls-jobs' };
/** The handoff app: one ClsModule set-up per platform. */
const HANDOFF_SETUPS: [AdapterName, ClsMount][] = [
  ['express', 'middleware'],
  ['fastify', 'none'],
];

/**
 * A `@Transactional(Propagation.Nested)` service runs in a savepoint of the claim's transaction
 * (TypeORM's `manager.transaction()` on the claim's manager): what it registers with
 * `IdempotencyContext.afterCommit()` and `enqueue()` follows that savepoint (finding 7 of issue
 * 37). Its failure, caught by the handler, used to undo its write but still fire its callback and
 * write its job.
 */
describe.each(HANDOFF_SETUPS)(
  'afterCommit and enqueue in a Nested service (%s, ClsModule %s)',
  (adapter, mount) => {
    let db: TestDatabase;
    let running: ChildApp;

    beforeAll(async () => {
      db = await createTestDatabase();
      running = await startChildApp(adapter, { databaseUrl: db.url, mount, handoff: HANDOFF } as never, {
        entry: CHILD,
      });
    });

    afterAll(async () => {
      await running?.stop();
      await db?.drop();
    });

    const orders = (id: string, note: string) =>
      db.count('SELECT count(*) FROM orders WHERE event_id = $1', [`${id}:${note}`]);
    const jobs = (id: string) =>
      db.count(`SELECT count(*) FROM ${HANDOFF.schema}.job WHERE name = $1 AND data->'data'->>'event' = $2`, [
        HANDOFF.queue,
        id,
      ]);
    const callbacks = async (id: string) => (await request(running.url).get(`/cls/callbacks/${id}`)).body;

    it('drops the callback and the job of a Nested service that threw, caught: 200, its write undone', async () => {
      const id = `evt_cls_after_fail_${adapter}_${mount}`;
      const answer = await request(running.url)
        .post('/cls/nested-after')
        .send({ id, fail: true, enqueue: HANDOFF.queue });
      expect(answer.status).toBe(200);
      expect(answer.body).toEqual({ refused: true });
      expect(await orders(id, 'outer')).toBe(1);
      expect(await orders(id, 'nested')).toBe(0);
      expect(await jobs(id)).toBe(0);
      expect(await callbacks(id)).toEqual(['handler']);
    });

    it('runs the callback and writes the job of a Nested service that committed, once', async () => {
      const id = `evt_cls_after_ok_${adapter}_${mount}`;
      const answer = await request(running.url)
        .post('/cls/nested-after')
        .send({ id, enqueue: HANDOFF.queue });
      expect(answer.body).toEqual({ refused: false });
      expect(await orders(id, 'nested')).toBe(1);
      expect(await jobs(id)).toBe(1);
      expect(await callbacks(id)).toEqual(['handler', 'nested']);
      const replayed = await request(running.url)
        .post('/cls/nested-after')
        .send({ id, enqueue: HANDOFF.queue });
      expect(replayed.headers['idempotent-replayed']).toBe('true');
      expect(await callbacks(id)).toEqual(['handler', 'nested']);
      expect(await jobs(id)).toBe(1);
    });
  },
);
