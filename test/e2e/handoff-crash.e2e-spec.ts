import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { HandoffOptions, HandoffQueueOptions } from '../../lib/index.js';
import {
  EXTERNAL_QUEUE,
  EXTERNAL_WORKER_SCOPE,
  TX_QUEUE,
  TX_WORKER_SCOPE,
  WEBHOOK_SCOPE,
  type HandoffEvent,
  type HandoffSettings,
  type WorkerName,
} from '../fixtures/handoff.fixture.js';
import { createTestDatabase, openTransactions, type TestDatabase } from '../support/database.js';
import { startHandoffProcess, type HandoffProcess } from '../support/handoff-process.js';
import { FakeFulfilmentApi } from '../support/sample-downstream.js';
import { waitUntil } from '../support/wait-until.js';

/** pg-boss's schema in this file. */
const SCHEMA = 'jobs';
/** A killed worker's job expires this soon; the external worker's lease (EXTERNAL_LEASE_MS) matches. */
const EXPIRE_SECONDS = 2;
/** How long a killed worker's job may take to be handed out again and finished. */
const SETTLE_MS = 30_000;

/** Quick retries, expiry and maintenance, so a dead worker's job comes back within seconds. */
const quick = (expireInSeconds: number): HandoffOptions => {
  const queue: HandoffQueueOptions = {
    retryLimit: 5,
    retryDelaySeconds: 0,
    retryBackoff: false,
    expireInSeconds,
  };
  return {
    schema: SCHEMA,
    pollingIntervalMs: 100,
    maintenanceIntervalSeconds: 1,
    queues: { [TX_QUEUE]: queue, [EXTERNAL_QUEUE]: queue },
  };
};

/**
 * The handoff across real processes that are SIGKILLed: between the enqueue and its COMMIT, and
 * mid-job in both modes; and two worker processes racing for one queue's jobs, duplicates among
 * them. Every event has one database effect; the downstream sees one Idempotency-Key per event.
 */
describe('handoff crashes and races (child processes)', () => {
  let db: TestDatabase;
  let api: FakeFulfilmentApi;
  const children: HandoffProcess[] = [];
  /** The webhook app the worker tests enqueue through, started once (a boot costs seconds here). */
  let web: HandoffProcess | undefined;

  beforeAll(async () => {
    db = await createTestDatabase();
    api = await FakeFulfilmentApi.start();
  });

  afterEach(async () => {
    for (const child of children.splice(0)) await child.kill();
  });

  afterAll(async () => {
    await web?.kill();
    await api.close();
    await db.drop();
  });

  async function spawn(
    tag: string,
    options: { web?: boolean; workers?: WorkerName[]; handoff: HandoffOptions; concurrency?: number },
  ): Promise<HandoffProcess> {
    const settings: HandoffSettings = {
      databaseUrl: db.url,
      tag,
      web: options.web ?? false,
      workers: options.workers ?? [],
      downstreamUrl: api.url,
      idempotency: { handoff: options.handoff },
    };
    const child = await startHandoffProcess(settings, {
      concurrency: options.concurrency,
      leaseMs: EXPIRE_SECONDS * 1000,
    });
    children.push(child);
    return child;
  }

  /** The shared webhook app; its queue settings are the file's, so it never changes a queue's. */
  async function webhook(): Promise<HandoffProcess> {
    if (web) return web;
    const child = await spawn('web', { web: true, handoff: quick(EXPIRE_SECONDS) });
    // Kept across tests: the file's afterAll kills it, not each test's cleanup.
    children.splice(children.indexOf(child), 1);
    return (web = child);
  }

  const post = (url: string, event: HandoffEvent) =>
    fetch(`${url}/webhook`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(event),
    });
  const jobs = (queue: string, key: string) =>
    db.pool
      .query(
        `SELECT id, state, retry_count FROM ${SCHEMA}.job WHERE name = $1 AND data->'event'->>'key' = $2`,
        [queue, key],
      )
      .then((result) => result.rows as { id: string; state: string; retry_count: number }[]);
  const claim = (scope: string, key: string) =>
    db.pool
      .query('SELECT status, attempts FROM processed_events WHERE scope = $1 AND event_key = $2', [
        scope,
        key,
      ])
      .then((result) => result.rows[0] as { status: string; attempts: number } | undefined);
  const effects = (key: string) =>
    db.pool
      .query('SELECT attempt FROM downstream_calls WHERE event_id = $1 ORDER BY id', [key])
      .then((result) => result.rows.map((row) => row.attempt as number));
  /** Jobs on `queue` that have not completed, whatever their event. */
  const unfinished = (queue: string) =>
    db.count(`SELECT count(*) FROM ${SCHEMA}.job WHERE name = $1 AND state <> 'completed'`, [queue]);
  const completed = async (queue: string, key: string) =>
    (await jobs(queue, key)).every((job) => job.state === 'completed');

  it('SIGKILL between the enqueue and its COMMIT leaves no claim and no job; the redelivery enqueues once', async () => {
    // The process the redelivery reaches is booted beside the one that dies, as a second replica:
    // it holds nothing of the killed one's, so what it finds is only what the database kept.
    const [web, again] = await Promise.all([
      spawn('web-killed', { web: true, handoff: quick(EXPIRE_SECONDS) }),
      spawn('web-2', { web: true, handoff: quick(EXPIRE_SECONDS) }),
    ]);
    const answer = post(web.url, { id: 'evt_kill_web', park: true }).catch((error: unknown) => error);
    await web.entered('webhook:evt_kill_web');
    await web.kill();
    // The connection died without an answer (an Error of the fetch's realm, hence the name check).
    expect(await answer).toMatchObject({ name: 'TypeError', message: 'fetch failed' });
    // Postgres rolled the transaction back when the connection died.
    await waitUntil(async () => (await openTransactions(db)) === 0, 'the killed transaction to end');
    expect(await claim(WEBHOOK_SCOPE, 'evt_kill_web')).toBeUndefined();
    expect(await jobs(TX_QUEUE, 'evt_kill_web')).toEqual([]);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', ['evt_kill_web'])).toBe(0);

    expect((await post(again.url, { id: 'evt_kill_web' })).status).toBe(200);
    const replay = await post(again.url, { id: 'evt_kill_web' });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(await jobs(TX_QUEUE, 'evt_kill_web')).toHaveLength(1);
    expect(await claim(WEBHOOK_SCOPE, 'evt_kill_web')).toEqual({ status: 'done', attempts: 1 });
  });

  it('SIGKILL of a transaction-mode worker mid-job: pg-boss hands the job out again after its expiry, one effect', async () => {
    const web = await webhook();
    expect((await post(web.url, { id: 'evt_kill_tx', job: { parkIn: 'A' } })).status).toBe(200);
    const a = await spawn('A', { workers: ['tx'], handoff: quick(EXPIRE_SECONDS) });
    await a.entered('evt_kill_tx');
    await a.kill();
    expect((await jobs(TX_QUEUE, 'evt_kill_tx'))[0].state).toBe('active');

    const b = await spawn('B', { workers: ['tx'], handoff: quick(EXPIRE_SECONDS) });
    await waitUntil(() => completed(TX_QUEUE, 'evt_kill_tx'), 'the job to complete in B', SETTLE_MS);
    // A's row was rolled back with its claim; B's committed with its claim and the completion.
    expect(await effects('evt_kill_tx')).toEqual([2]);
    const [job] = await jobs(TX_QUEUE, 'evt_kill_tx');
    expect(job.retry_count).toBe(1);
    // Recognised by its key (its id) when handed out again: one claim, the job's.
    expect(await claim(TX_WORKER_SCOPE, job.id)).toEqual({ status: 'done', attempts: 1 });
    // B is the first worker on this queue, so it also runs the first test's job (evt_kill_web):
    // waited for here, so no test after this one finds a job it did not write. None failed.
    await waitUntil(
      async () => (await unfinished(TX_QUEUE)) === 0,
      'every earlier job to complete',
      SETTLE_MS,
    );
    expect((await b.metrics()).jobs[TX_QUEUE]?.failed).toBeUndefined();
  });

  it('SIGKILL of an external-mode worker mid-job: handed out again, the downstream sees the same Idempotency-Key, one effect', async () => {
    const web = await webhook();
    const event = { id: 'evt_kill_ext', queue: EXTERNAL_QUEUE, job: { parkIn: 'A' } };
    expect((await post(web.url, event)).status).toBe(200);
    const a = await spawn('A', { workers: ['external'], handoff: quick(EXPIRE_SECONDS) });
    // A has called the downstream, and is killed before it records anything.
    await a.entered('evt_kill_ext');
    await a.kill();
    expect(api.callsFor('evt_kill_ext')).toHaveLength(1);

    await spawn('B', { workers: ['external'], handoff: quick(EXPIRE_SECONDS) });
    await waitUntil(() => completed(EXTERNAL_QUEUE, 'evt_kill_ext'), 'the job to complete in B', SETTLE_MS);
    const calls = api.callsFor('evt_kill_ext');
    expect(calls).toHaveLength(2);
    // The job's key (its id, header-safe as it is) on both attempts, not the event's.
    const [job] = await jobs(EXTERNAL_QUEUE, 'evt_kill_ext');
    expect(calls.map((call) => call.idempotencyKey)).toEqual([job.id, job.id]);
    // B re-claimed the expired lease (attempt 2) and made the one database effect.
    expect(await effects('evt_kill_ext')).toEqual([2]);
    expect(await claim(EXTERNAL_WORKER_SCOPE, job.id)).toEqual({ status: 'done', attempts: 2 });
  });

  it('two jobs of one event, their external-mode worker SIGKILLed mid-job: each is handed out again with its own key, one effect each', async () => {
    const web = await webhook();
    const lines = ['evt_kill_two:1', 'evt_kill_two:2'];
    const event = {
      id: 'evt_kill_two',
      queue: EXTERNAL_QUEUE,
      jobs: lines.map((effect) => ({ effect, parkIn: 'A' })),
    };
    expect((await post(web.url, event)).status).toBe(200);
    // A (concurrency 2) takes both jobs, calls the downstream for each, and is killed at the gates.
    const a = await spawn('A', { workers: ['external'], handoff: quick(EXPIRE_SECONDS) });
    await Promise.all(lines.map((line) => a.entered(line)));
    await a.kill();

    await spawn('B', { workers: ['external'], handoff: quick(EXPIRE_SECONDS) });
    await waitUntil(() => completed(EXTERNAL_QUEUE, 'evt_kill_two'), 'both jobs to complete in B', SETTLE_MS);
    const found = await jobs(EXTERNAL_QUEUE, 'evt_kill_two');
    expect(found).toHaveLength(2);
    const keyOf = new Map(
      await Promise.all(
        found.map(async (job) => {
          const { rows } = await db.pool.query(
            `SELECT data->'data'->>'effect' AS effect FROM ${SCHEMA}.job WHERE id = $1`,
            [job.id],
          );
          return [rows[0].effect as string, job.id] as const;
        }),
      ),
    );
    for (const line of lines) {
      const key = keyOf.get(line)!;
      // Each job's calls carry its own key, the same on A's attempt and B's.
      expect([line, api.callsFor(line).map((call) => call.idempotencyKey)]).toEqual([line, [key, key]]);
      expect([line, await effects(line)]).toEqual([line, [2]]);
      expect(await claim(EXTERNAL_WORKER_SCOPE, key)).toEqual({ status: 'done', attempts: 2 });
    }
  });

  it('two worker processes racing on one queue, two jobs per event: one effect per event, every job completed', async () => {
    // The metrics below count every job of the queue: none may be left from another test.
    expect(await unfinished(TX_QUEUE)).toBe(0);
    // Booted first, so their queue settings (jobs that outlive any park here) are the ones in force.
    const handoff = quick(60);
    const [a, b] = await Promise.all([
      spawn('A', { workers: ['tx'], handoff, concurrency: 1 }),
      spawn('B', { workers: ['tx'], handoff, concurrency: 1 }),
    ]);
    const web = await webhook();
    const enteredEither = (id: string) => Promise.any([a.entered(id), b.entered(id)]);
    // Two gate jobs first: whichever worker takes one parks on it, so the other takes the second:
    // both processes take part, and neither fetches while the race's jobs are written.
    for (const id of ['evt_gate_1', 'evt_gate_2']) {
      expect((await post(web.url, { id, job: { parkIn: '*' } })).status).toBe(200);
      await enteredEither(id);
    }
    expect(a.hasEntered('evt_gate_1') !== a.hasEntered('evt_gate_2')).toBe(true);
    const keys = Array.from({ length: 20 }, (_, i) => `evt_race_${i}`);
    for (const id of keys) expect((await post(web.url, { id })).status).toBe(200);
    // pg-boss delivering a job twice: a second job per event with the same data (the job's key
    // included, so the copy is the same job to its claim) and created_on,
    // so the two sit side by side in fetch order and the two workers take them at the same time.
    const copied = await db.pool.query(
      `INSERT INTO ${SCHEMA}.job (name, data, retry_limit, retry_delay, retry_backoff, expire_in, keep_until,
                                  dead_letter, policy, created_on)
       SELECT name, data, retry_limit, retry_delay, retry_backoff, expire_in, keep_until, dead_letter, policy,
              created_on
       FROM ${SCHEMA}.job WHERE name = $1 AND data->'event'->>'key' LIKE 'evt_race_%'`,
      [TX_QUEUE],
    );
    expect(copied.rowCount).toBe(keys.length);
    for (const child of [a, b]) for (const id of ['evt_gate_1', 'evt_gate_2']) child.open(id);

    const all = [...keys, 'evt_gate_1', 'evt_gate_2'];
    await waitUntil(async () => (await unfinished(TX_QUEUE)) === 0, 'every job to complete', SETTLE_MS);
    for (const key of all) expect([key, (await effects(key)).length]).toEqual([key, 1]);
    const [ma, mb] = [(await a.metrics()).jobs[TX_QUEUE], (await b.metrics()).jobs[TX_QUEUE]];
    expect((ma.completed ?? 0) + (mb.completed ?? 0)).toBe(all.length);
    expect((ma.replayed ?? 0) + (mb.replayed ?? 0)).toBe(keys.length);
    expect(ma.completed).toBeGreaterThanOrEqual(1);
    expect(mb.completed).toBeGreaterThanOrEqual(1);
  });
});
