import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import {
  HANDLER_TX_CLAIM_SCOPE,
  HANDLER_TX_QUEUE,
  HANDLER_TX_SCHEMA,
  HANDLER_TX_SCOPE,
  HANDLER_TX_WORKER_SCOPE,
  HandlerTxFixtureModule,
  HandlerTxRecorder,
  TransactionAudit,
  type HandlerTxEvent,
} from '../fixtures/handler-transactions.fixture.js';
import { ADAPTERS, onAdapter, startApp, type AdapterName, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow } from '../support/lease-rows.js';
import { waitUntil } from '../support/wait-until.js';

/** pg-boss's schema in this file. */
const JOB_SCHEMA = 'handler_tx_jobs';

/** One app of this file, its database and what its callbacks recorded. */
interface Harness {
  db: TestDatabase;
  running: RunningApp;
  recorder: HandlerTxRecorder;
}

/**
 * An app on a database of its own, with the handoff configured (and its worker, or a subscriber of
 * the user's, if asked).
 */
async function harness(adapter: AdapterName, worker: boolean, subscribed = false): Promise<Harness> {
  const db = await createTestDatabase();
  await db.pool.query(HANDLER_TX_SCHEMA);
  const running = await startApp(adapter, [
    HandlerTxFixtureModule.forSettings({
      databaseUrl: db.url,
      worker,
      subscribed,
      idempotency: {
        reporter: false,
        handoff: { schema: JOB_SCHEMA, pollingIntervalMs: 100, queues: { [HANDLER_TX_QUEUE]: {} } },
      },
    }),
  ]);
  return { db, running, recorder: running.app.get(HandlerTxRecorder) };
}

/** The rows of event `id`'s levels, by writer, in the order written. */
async function effects(db: TestDatabase, id: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ writer: string }>(
    'SELECT writer FROM handler_tx_effects WHERE event_id = $1 ORDER BY id',
    [id],
  );
  return rows.map((row) => row.writer);
}

/** The jobs of event `id`'s levels on the queue, in any state, by writer. */
async function jobs(db: TestDatabase, id: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ writer: string }>(
    `SELECT data->'data'->>'writer' AS writer FROM ${JOB_SCHEMA}.job
      WHERE name = $1 AND data->'data'->>'event' = $2 ORDER BY created_on, writer`,
    [HANDLER_TX_QUEUE, id],
  );
  return rows.map((row) => row.writer);
}

/**
 * Transactions a handler opens itself inside its claim's (finding 7 of issue 37): TypeORM's
 * `manager.transaction()` on the claim's manager runs as a savepoint, and its rollback undid the
 * writes but not the after-commit callbacks or the jobs registered inside it, so a caught failure
 * there still fired its callback (and sent its job) for work that never committed. Now the
 * callbacks and the jobs follow the fate of the level that registered them, whichever opened it
 * (manager.transaction(), the runner by hand, the library's own nested claims, in any order).
 * Each callback checks, from another connection, that its level's row is committed when it runs.
 */
describe.each(ADAPTERS)('after-commit callbacks inside transactions the handler opens (%s)', (adapter) => {
  let h: Harness;

  beforeAll(async () => {
    h = await harness(adapter, false);
  });

  afterAll(async () => {
    await h?.running.close();
    await h?.db.drop();
  });

  const deliver = (event: HandlerTxEvent) => request(h.running.url).post('/handler-tx').send(event);
  const uid = (name: string) => `evt_htx_${name}_${adapter}`;
  const committed = (...names: string[]) => names.map((name) => ({ name, rowCommitted: true }));

  it('drops the callback of a manager.transaction() that wrote, registered it and threw, caught: 200', async () => {
    // The case: context.manager.transaction(em => { insert; context.afterCommit(cb); throw }).
    const id = uid('issue');
    const answer = await deliver({ id, inner: [{ name: 'tx', fails: true }] });
    expect(answer.status).toBe(200);
    expect(answer.body).toEqual({ done: id });
    expect(await effects(h.db, id)).toEqual(['handler']);
    expect(h.recorder.callbacks(id)).toEqual(committed('handler', 'handler:after'));
    expect((await claimRow(h.db, HANDLER_TX_SCOPE, id))?.status).toBe('done');
  });

  it('runs the callback of a nested transaction that committed once, after the COMMIT, in order', async () => {
    const id = uid('committed');
    expect((await deliver({ id, inner: [{ name: 'tx' }] })).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler', 'tx']);
    expect(h.recorder.callbacks(id)).toEqual(committed('handler', 'tx', 'handler:after'));
    // Replayed: nothing runs again.
    const again = await deliver({ id, inner: [{ name: 'tx' }] });
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(h.recorder.callbacks(id)).toHaveLength(3);
  });

  it('keeps what the levels beside a rolled-back one registered, before and after it', async () => {
    const id = uid('siblings');
    const event = {
      id,
      inner: [{ name: 'x', fails: true }, { name: 'y' }, { name: 'z', fails: true }, { name: 'w' }],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler', 'y', 'w']);
    expect(h.recorder.callbacks(id)).toEqual(committed('handler', 'y', 'w', 'handler:after'));
  });

  it('drops a committed inner level’s callback when its enclosing level, also the handler’s, rolls back', async () => {
    const id = uid('inner_committed_outer_rolled_back');
    const event = { id, inner: [{ name: 'outer', fails: true, inner: [{ name: 'inner' }] }] };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler']);
    expect(h.recorder.callbacks(id)).toEqual(committed('handler', 'handler:after'));
  });

  it('drops a rolled-back inner level’s callback and keeps its committed enclosing level’s', async () => {
    const id = uid('inner_rolled_back_outer_committed');
    const event = {
      id,
      inner: [{ name: 'outer', inner: [{ name: 'inner', fails: true }, { name: 'sibling' }] }],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler', 'outer', 'sibling']);
    expect(h.recorder.callbacks(id)).toEqual(
      committed('handler', 'outer', 'sibling', 'outer:after', 'handler:after'),
    );
  });

  it('follows three levels deep: the middle one’s rollback takes the deepest with it', async () => {
    const id = uid('three_deep');
    const event = {
      id,
      inner: [
        { name: 'a', inner: [{ name: 'b', fails: true, inner: [{ name: 'c', inner: [{ name: 'd' }] }] }] },
      ],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler', 'a']);
    expect(h.recorder.callbacks(id)).toEqual(committed('handler', 'a', 'a:after', 'handler:after'));
  });

  it('follows a transaction opened by hand on the manager’s runner (startTransaction/rollbackTransaction)', async () => {
    const id = uid('runner');
    const event = {
      id,
      inner: [
        { name: 'rolled', via: 'runner' as const, fails: true },
        { name: 'kept', via: 'runner' as const },
      ],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler', 'kept']);
    expect(h.recorder.callbacks(id)).toEqual(committed('handler', 'kept', 'handler:after'));
  });

  it('drops a nested claim’s callbacks when the handler’s transaction around it rolls back; the claim is not done', async () => {
    // An @Idempotent method called inside manager.transaction(): its savepoint is released into
    // the handler's, whose rollback takes the claim, its row and its callback.
    const id = uid('claim_in_tx');
    const event = {
      id,
      inner: [{ name: 'tx', fails: true, inner: [{ name: 'claim', via: 'claim' as const }] }],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler']);
    expect(h.recorder.callbacks(id)).toEqual(committed('handler', 'handler:after'));
    expect(await claimRow(h.db, HANDLER_TX_CLAIM_SCOPE, `${id}:claim`)).toBeUndefined();
  });

  it('keeps a nested claim’s callbacks when the handler’s transaction inside it rolls back, and drops that one’s', async () => {
    const id = uid('tx_in_claim');
    const event = {
      id,
      inner: [{ name: 'claim', via: 'claim' as const, inner: [{ name: 'tx', fails: true }] }],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler', 'claim']);
    expect(h.recorder.callbacks(id)).toEqual(committed('handler', 'claim', 'claim:after', 'handler:after'));
    expect((await claimRow(h.db, HANDLER_TX_CLAIM_SCOPE, `${id}:claim`))?.status).toBe('done');
  });

  it('drops a committed handler transaction’s callbacks with the nested claim around it that failed', async () => {
    const id = uid('tx_in_failed_claim');
    const event = {
      id,
      inner: [{ name: 'claim', via: 'claim' as const, fails: true, inner: [{ name: 'tx' }] }],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler']);
    expect(h.recorder.callbacks(id)).toEqual(committed('handler', 'handler:after'));
    expect((await claimRow(h.db, HANDLER_TX_CLAIM_SCOPE, `${id}:claim`))?.status).not.toBe('done');
  });

  it('interleaves the handler’s levels and nested claims: each callback runs iff its work committed', async () => {
    const id = uid('interleaved');
    const event: HandlerTxEvent = {
      id,
      inner: [
        {
          name: 'tx1',
          inner: [
            { name: 'claim1', via: 'claim', inner: [{ name: 'tx2', fails: true }, { name: 'tx3' }] },
            { name: 'claim2', via: 'claim', fails: true, inner: [{ name: 'tx4' }] },
            { name: 'tx5', fails: true, inner: [{ name: 'claim3', via: 'claim' }] },
          ],
        },
        { name: 'tx6', via: 'runner', inner: [{ name: 'tx7', fails: true }] },
      ],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler', 'tx1', 'claim1', 'tx3', 'tx6']);
    expect(h.recorder.callbacks(id)).toEqual(
      committed(
        'handler',
        'tx1',
        'claim1',
        'tx3',
        'claim1:after',
        'tx1:after',
        'tx6',
        'tx6:after',
        'handler:after',
      ),
    );
  });

  it('still drops every callback when the handler itself fails: 500, nothing written', async () => {
    const id = uid('handler_fails');
    const answer = await deliver({
      id,
      fails: true,
      inner: [{ name: 'tx' }, { name: 'claim', via: 'claim' }],
    });
    expect(answer.status).toBe(500);
    expect(await effects(h.db, id)).toEqual([]);
    expect(h.recorder.callbacks(id)).toEqual([]);
    expect((await claimRow(h.db, HANDLER_TX_SCOPE, id))?.status).toBe('failed');
  });
});

/**
 * `IdempotencyContext.enqueue()` inside a transaction the handler opened: the job is sent with the
 * claim's COMMIT, so it used to be written even when that transaction had rolled back, and the
 * worker ran work whose cause was undone. Now it goes (or not) with its level, as callbacks do.
 */
describe.each(onAdapter('fastify'))('jobs enqueued inside transactions the handler opens (%s)', (adapter) => {
  let h: Harness;

  beforeAll(async () => {
    h = await harness(adapter, true);
  });

  afterAll(async () => {
    await h?.running.close();
    await h?.db.drop();
  });

  const deliver = (event: HandlerTxEvent) => request(h.running.url).post('/handler-tx').send(event);
  const uid = (name: string) => `evt_htx_job_${name}_${adapter}`;
  const worked = (id: string) =>
    h.db.pool
      .query<{ writer: string }>('SELECT writer FROM handler_tx_worked WHERE event_id = $1 ORDER BY id', [id])
      .then(({ rows }) => rows.map((row) => row.writer));
  /** Until the worker has run `id`'s job and nothing on the queue is waiting or running. */
  const drained = (id: string) =>
    waitUntil(async () => {
      if ((await worked(id)).length === 0) return false;
      const pending = await h.db.count(
        `SELECT count(*) FROM ${JOB_SCHEMA}.job WHERE name = $1 AND state IN ('created', 'retry', 'active')`,
        [HANDLER_TX_QUEUE],
      );
      return pending === 0;
    }, `the worker to run ${id}'s job and drain the queue`);

  it('writes no job for a nested transaction that rolled back, and the worker runs nothing for it', async () => {
    const id = uid('rolled_back');
    const answer = await deliver({ id, inner: [{ name: 'tx', enqueue: true, fails: true }] });
    expect(answer.status).toBe(200);
    expect(await jobs(h.db, id)).toEqual([]);
    expect(await effects(h.db, id)).toEqual(['handler']);
    expect(h.recorder.callbacks(id).map((run) => run.name)).toEqual(['handler', 'handler:after']);

    // A job committed after it: once the worker has run that one and the queue is empty, a job of
    // the rolled-back level, had it been written, would have run.
    const marker = uid('marker');
    expect((await deliver({ id: marker, enqueue: true })).status).toBe(200);
    await drained(marker);
    expect(await worked(marker)).toEqual(['handler']);
    expect(await worked(id)).toEqual([]);
  });

  it('writes the job of a nested transaction that committed; the worker runs it once', async () => {
    const id = uid('committed');
    expect((await deliver({ id, inner: [{ name: 'tx', enqueue: true }] })).status).toBe(200);
    expect(await jobs(h.db, id)).toEqual(['tx']);
    expect(h.recorder.callbacks(id)).toEqual([
      { name: 'handler', rowCommitted: true },
      { name: 'tx', rowCommitted: true },
      { name: 'handler:after', rowCommitted: true },
    ]);
    await drained(id);
    expect(await worked(id)).toEqual(['tx']);
    // The worker claims a job by its own key (the job's id unless enqueue() was given one).
    const [job] = (
      await h.db.pool.query<{ key: string }>(
        `SELECT data->>'key' AS key FROM ${JOB_SCHEMA}.job WHERE name = $1 AND data->'data'->>'event' = $2`,
        [HANDLER_TX_QUEUE, id],
      )
    ).rows;
    expect((await claimRow(h.db, HANDLER_TX_WORKER_SCOPE, job.key))?.status).toBe('done');
  });

  it('writes no job for a nested claim inside a handler transaction that rolled back', async () => {
    const id = uid('claim_in_tx');
    const event: HandlerTxEvent = {
      id,
      inner: [{ name: 'tx', fails: true, inner: [{ name: 'claim', via: 'claim', enqueue: true }] }],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await jobs(h.db, id)).toEqual([]);
    expect(await effects(h.db, id)).toEqual(['handler']);
  });

  it('commits a delivery all of whose jobs were rolled back with a nested claim: 200, no job', async () => {
    // The COMMIT once had a list of statements to send, emptied by the rollback: the plain COMMIT.
    const id = uid('claim_rolled_back');
    const answer = await deliver({
      id,
      inner: [{ name: 'claim', via: 'claim', enqueue: true, fails: true }],
    });
    expect(answer.status).toBe(200);
    expect(await jobs(h.db, id)).toEqual([]);
    expect(await effects(h.db, id)).toEqual(['handler']);
    expect((await claimRow(h.db, HANDLER_TX_SCOPE, id))?.status).toBe('done');
  });

  it('writes only the jobs of the levels that committed, the handler’s own with them', async () => {
    const id = uid('mixed');
    const event: HandlerTxEvent = {
      id,
      enqueue: true,
      inner: [
        { name: 'undone', enqueue: true, fails: true, inner: [{ name: 'undone-inner', enqueue: true }] },
        { name: 'kept', enqueue: true, inner: [{ name: 'kept-undone', enqueue: true, fails: true }] },
      ],
    };
    expect((await deliver(event)).status).toBe(200);
    expect((await jobs(h.db, id)).sort()).toEqual(['handler', 'kept']);
    expect(await effects(h.db, id)).toEqual(['handler', 'kept']);
  });
});

/**
 * With a subscriber of the user's, the claim's own BEGIN and COMMIT are broadcast through the
 * runner as well (at depth 0, which is not a level of the handler's): the handler's levels are
 * followed the same, and the user's subscriber hears them as before.
 */
describe.each(onAdapter('express'))('with a subscriber of the user’s on the DataSource (%s)', (adapter) => {
  let h: Harness;

  beforeAll(async () => {
    h = await harness(adapter, false, true);
  });

  afterAll(async () => {
    await h?.running.close();
    await h?.db.drop();
  });

  const deliver = (event: HandlerTxEvent) => request(h.running.url).post('/handler-tx').send(event);
  const uid = (name: string) => `evt_htx_subscribed_${name}_${adapter}`;

  it('drops what a rolled-back nested transaction registered and keeps the rest; the subscriber hears the rollback', async () => {
    const id = uid('mixed');
    TransactionAudit.rollbacks.length = 0;
    const event: HandlerTxEvent = {
      id,
      enqueue: true,
      inner: [
        { name: 'undone', enqueue: true, fails: true },
        { name: 'kept', enqueue: true, inner: [{ name: 'claim', via: 'claim', fails: true }] },
      ],
    };
    expect((await deliver(event)).status).toBe(200);
    expect(await effects(h.db, id)).toEqual(['handler', 'kept']);
    expect((await jobs(h.db, id)).sort()).toEqual(['handler', 'kept']);
    expect(h.recorder.callbacks(id).map((run) => run.name)).toEqual([
      'handler',
      'kept',
      'kept:after',
      'handler:after',
    ]);
    // The handler's savepoint; the nested claim's is the library's own, sent on the connection.
    expect(TransactionAudit.rollbacks).toEqual(['savepoint']);
  });

  it('still drops everything when the handler fails: the subscriber hears that rollback too', async () => {
    const id = uid('fails');
    TransactionAudit.rollbacks.length = 0;
    expect(
      (await deliver({ id, fails: true, enqueue: true, inner: [{ name: 'tx', enqueue: true }] })).status,
    ).toBe(500);
    expect(await effects(h.db, id)).toEqual([]);
    expect(await jobs(h.db, id)).toEqual([]);
    expect(h.recorder.callbacks(id)).toEqual([]);
    expect(TransactionAudit.rollbacks).toEqual(['transaction']);
  });
});
