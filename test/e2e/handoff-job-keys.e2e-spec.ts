import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { HandoffOptions } from '../../lib/index.js';
import { HandoffMetrics } from '../../lib/observability/index.js';
import { HandoffQueues } from '../../lib/operator/index.js';
import {
  keyEmpty,
  keyHasControl,
  keyHasNul,
  keyNotString,
  keyTooLong,
} from '../../lib/core/idempotency-key.js';
import { QueueHandoff } from '../../lib/transports/queue/queue-handoff.js';
import {
  CALLER_HEADER,
  HandoffFixtureModule,
  REQUEST_SCOPE,
  SECOND_WEBHOOK_SCOPE,
  TX_QUEUE,
  TX_WORKER_SCOPE,
  WEBHOOK_SCOPE,
  type HandoffEvent,
  type HandoffSettings,
  type WorkJob,
  type WorkerName,
} from '../fixtures/handoff.fixture.js';
import { Gates } from '../fixtures/webhook-fixture.module.js';
import { startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';
import { waitUntil } from '../support/wait-until.js';

/** pg-boss's schema in this file. */
const SCHEMA = 'job_keys';
/** Quick retries and polling: a job that finds its key in flight is retried at once. */
const HANDOFF: HandoffOptions = {
  schema: SCHEMA,
  pollingIntervalMs: 100,
  maintenanceIntervalSeconds: 1,
  queues: { [TX_QUEUE]: { retryLimit: 3, retryDelaySeconds: 0, retryBackoff: false, expireInSeconds: 30 } },
};

/** The label enqueue()'s key check names a bad key by (the webhook's scope, the queue). */
const ENQUEUED = `the job ${WEBHOOK_SCOPE} enqueued on ${TX_QUEUE}`;

/**
 * Each job is claimed by its own key (enqueue()'s `key`, else its id), not by the event that
 * enqueued it: every job enqueued runs, once. Before, a worker claimed a job by its event's key,
 * so a second job with that key on the queue (a second enqueue() in one delivery, another scope's
 * event with the same id, a client's request-mode key) found a done claim and was completed as
 * "replayed" without running, silently. On real Postgres and real pg-boss, in one process.
 */
describe('handoff: every job is claimed by its own key', () => {
  let db: TestDatabase;
  const apps: RunningApp[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterEach(async () => {
    for (const running of apps.splice(0).reverse()) {
      running.app.get(Gates).openAll();
      await running.close();
    }
  });

  afterAll(async () => {
    await db.drop();
  });

  async function start(options: { web?: boolean; workers?: WorkerName[]; logs?: LogCapture } = {}) {
    const settings: HandoffSettings = {
      databaseUrl: db.url,
      web: options.web ?? true,
      workers: options.workers ?? [],
      idempotency: { handoff: HANDOFF },
    };
    const running = await startApp('express', [HandoffFixtureModule.forSettings(settings)], {
      logger: options.logs ?? false,
    });
    apps.push(running);
    return running;
  }

  const post = (url: string, event: HandoffEvent, path = 'webhook') =>
    fetch(`${url}/${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(event),
    });
  const request = (url: string, caller: string, key: string, jobs: WorkJob[]) =>
    fetch(`${url}/request`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': `"${key}"`, [CALLER_HEADER]: caller },
      body: JSON.stringify({ jobs }),
    });

  /** The jobs of the events `keys` on the tx queue, whatever their state. */
  const jobs = (...keys: string[]) =>
    db.pool
      .query(
        `SELECT id, state, data->>'key' AS key FROM ${SCHEMA}.job
         WHERE name = $1 AND data->'event'->>'key' = ANY ($2) ORDER BY created_on, id`,
        [TX_QUEUE, keys],
      )
      .then((result) => result.rows as { id: string; state: string; key: string }[]);
  const allCompleted = async (...keys: string[]) => {
    const found = await jobs(...keys);
    return found.length > 0 && found.every((job) => job.state === 'completed');
  };
  /** Effects the worker made under `effect` (one `downstream_calls` row per run that committed). */
  const effects = (effect: string) =>
    db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [effect]);
  const claims = (scope: string) =>
    db.pool
      .query('SELECT event_key, status, attempts FROM processed_events WHERE scope = $1 ORDER BY event_key', [
        scope,
      ])
      .then((result) => result.rows as { event_key: string; status: string; attempts: number }[]);
  const footprint = async (id: string) => ({
    claims: await db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [id]),
    orders: await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]),
    jobs: (await jobs(id)).length,
  });

  it('two enqueues in one delivery (a job per line item): both jobs run, one effect each', async () => {
    const web = await start({ workers: ['tx'] });
    const lines = [{ effect: 'evt_lines:1' }, { effect: 'evt_lines:2' }];
    const answer = await post(web.url, { id: 'evt_lines', jobs: lines });
    expect(answer.status).toBe(200);
    const { jobIds } = (await answer.json()) as { jobIds: string[] };
    expect(new Set(jobIds).size).toBe(2);
    await waitUntil(() => allCompleted('evt_lines'), 'both jobs to complete');

    expect([await effects('evt_lines:1'), await effects('evt_lines:2')]).toEqual([1, 1]);
    // Each job under a claim of its own, keyed by its id, which its data carries.
    const found = await jobs('evt_lines');
    expect(found.map((job) => job.key)).toEqual(found.map((job) => job.id));
    expect(found.map((job) => job.id).sort()).toEqual([...jobIds].sort());
    expect(await claims(TX_WORKER_SCOPE)).toEqual(
      [...jobIds].sort().map((id) => ({ event_key: id, status: 'done', attempts: 1 })),
    );
    expect(web.app.get(HandoffMetrics).snapshot().jobs[TX_QUEUE]).toEqual({ completed: 2 });
  });

  it('two handlers of different scopes whose events share a key and a queue: both jobs run', async () => {
    const web = await start({ workers: ['tx'] });
    expect((await post(web.url, { id: 'evt_shared', job: { effect: 'evt_shared:first' } })).status).toBe(200);
    expect(
      (await post(web.url, { id: 'evt_shared', job: { effect: 'evt_shared:second' } }, 'webhook/second'))
        .status,
    ).toBe(200);
    await waitUntil(
      async () => (await jobs('evt_shared')).length === 2 && allCompleted('evt_shared'),
      'both jobs',
    );

    expect([await effects('evt_shared:first'), await effects('evt_shared:second')]).toEqual([1, 1]);
    const enqueuedBy = await db.pool.query(
      `SELECT data->'event'->>'scope' AS scope FROM ${SCHEMA}.job WHERE data->'event'->>'key' = 'evt_shared' ORDER BY 1`,
    );
    expect(enqueuedBy.rows.map((row) => row.scope)).toEqual([WEBHOOK_SCOPE, SECOND_WEBHOOK_SCOPE].sort());
    expect(web.app.get(HandoffMetrics).snapshot().jobs[TX_QUEUE]).toEqual({ completed: 2 });
  });

  it("a request-mode route: a client's key cannot suppress another delivery's job, and its own jobs all run once", async () => {
    const web = await start({ workers: ['tx'] });
    // The request's claim key is `<caller>:<key>`, chosen by the client; a webhook event with
    // that very id hands off to the same queue.
    const claimKey = 'alice:order-1';
    const jobsOf = [{ effect: 'request:line-1' }, { effect: 'request:line-2' }];
    const first = await request(web.url, 'alice', 'order-1', jobsOf);
    expect(first.status).toBe(201);
    expect((await post(web.url, { id: claimKey, job: { effect: 'webhook:alice' } })).status).toBe(200);
    // The client's retry is replayed with the stored answer and enqueues nothing.
    const retry = await request(web.url, 'alice', 'order-1', jobsOf);
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    await waitUntil(
      async () => (await jobs(claimKey)).length === 3 && allCompleted(claimKey),
      'the three jobs',
    );

    expect({
      line1: await effects('request:line-1'),
      line2: await effects('request:line-2'),
      webhook: await effects('webhook:alice'),
      requestClaims: await claims(REQUEST_SCOPE),
    }).toEqual({
      line1: 1,
      line2: 1,
      webhook: 1,
      requestClaims: [{ event_key: claimKey, status: 'done', attempts: 1 }],
    });
    expect(web.app.get(HandoffMetrics).snapshot().jobs[TX_QUEUE]).toEqual({ completed: 3 });
  });

  it("enqueue()'s key: jobs with the same key run once across deliveries; the second is completed as replayed, counted and logged", async () => {
    const logs = new LogCapture();
    const web = await start({ workers: ['tx'], logs });
    const metrics = web.app.get(HandoffMetrics);
    expect(
      (await post(web.url, { id: 'evt_key_1', job: { key: 'ship:order-7', effect: 'ship:evt_key_1' } }))
        .status,
    ).toBe(200);
    await waitUntil(() => allCompleted('evt_key_1'), 'the first job to complete');
    expect(
      (await post(web.url, { id: 'evt_key_2', job: { key: 'ship:order-7', effect: 'ship:evt_key_2' } }))
        .status,
    ).toBe(200);
    await waitUntil(() => allCompleted('evt_key_2'), 'the second job to complete');

    expect([await effects('ship:evt_key_1'), await effects('ship:evt_key_2')]).toEqual([1, 0]);
    expect((await jobs('evt_key_1', 'evt_key_2')).map((job) => job.key)).toEqual([
      'ship:order-7',
      'ship:order-7',
    ]);
    expect(await claims(TX_WORKER_SCOPE)).toContainEqual({
      event_key: 'ship:order-7',
      status: 'done',
      attempts: 1,
    });
    expect(metrics.snapshot().jobs[TX_QUEUE]).toEqual({ completed: 1, replayed: 1 });
    const [second] = await jobs('evt_key_2');
    expect(
      logs.find('log', `Job ${second.id} of queue ${TX_QUEUE}`, 'completed without running', 'ship:order-7'),
    ).toHaveLength(1);
  });

  it('a job pg-boss hands out again after it ran is recognised by its key: one effect, completed as replayed and logged', async () => {
    const logs = new LogCapture();
    const web = await start({ workers: ['tx'], logs });
    expect((await post(web.url, { id: 'evt_again', job: { effect: 'evt_again' } })).status).toBe(200);
    await waitUntil(() => allCompleted('evt_again'), 'the job to complete');
    // What pg-boss does to a job it hands out again (an expired one, whose worker's completion
    // was lost): the same job, same id and data, back in the queue.
    const [job] = await jobs('evt_again');
    await db.pool.query(
      `UPDATE ${SCHEMA}.job SET state = 'retry', completed_on = NULL, started_on = NULL WHERE id = $1`,
      [job.id],
    );
    await waitUntil(() => allCompleted('evt_again'), 'the job handed out again to complete');

    expect(await effects('evt_again')).toBe(1);
    expect(web.app.get(HandoffMetrics).snapshot().jobs[TX_QUEUE]).toEqual({ completed: 1, replayed: 1 });
    expect(logs.find('log', `Job ${job.id}`, 'without running again', 'handed it out again')).toHaveLength(1);
  });

  it('a job an earlier version wrote (no key in its data) is claimed by its id: two of one event both run', async () => {
    const web = await start({ web: false, workers: [] });
    const handoff = web.app.get(QueueHandoff);
    const boss = handoff.pgBoss!;
    const event = { key: 'evt_legacy', scope: WEBHOOK_SCOPE, source: 'fixture' };
    const ids = [
      await boss.send(TX_QUEUE, { event, data: { effect: 'legacy:1' } }, { db: handoff.db }),
      await boss.send(TX_QUEUE, { event, data: { effect: 'legacy:2' } }, { db: handoff.db }),
    ];
    await start({ web: false, workers: ['tx'] });
    await waitUntil(() => allCompleted('evt_legacy'), 'both jobs to complete');

    expect([await effects('legacy:1'), await effects('legacy:2')]).toEqual([1, 1]);
    expect((await claims(TX_WORKER_SCOPE)).filter((claim) => ids.includes(claim.event_key))).toHaveLength(2);
  });

  it('a dead-lettered job moved back keeps its key: its worker claims it as the job it was', async () => {
    const web = await start({ workers: ['tx'] });
    const queues = web.app.get(HandoffQueues);
    // Fails every attempt: retryLimit 3 is four attempts, then the dead-letter queue.
    expect((await post(web.url, { id: 'evt_dead', job: { failAttempts: 1e9 } })).status).toBe(200);
    const [original] = await jobs('evt_dead');
    const deadLettered = async () =>
      (await queues.deadLetters()).filter((job) => job.event?.key === 'evt_dead');
    await waitUntil(async () => (await deadLettered()).length === 1, 'the job to be dead-lettered');
    expect(await claims(TX_WORKER_SCOPE)).toContainEqual({
      event_key: original.id,
      status: 'failed',
      attempts: 4,
    });

    const [dead] = await deadLettered();
    const retried = await queues.retryDeadLetter(TX_QUEUE, dead.id);
    expect(retried).toMatchObject({ retried: true });
    const jobId = (retried as { jobId: string }).jobId;
    expect(jobId).not.toBe(original.id);
    // A new pg-boss job, the same job to its claim: its four attempts add to the same claim's.
    await waitUntil(
      async () => (await deadLettered()).length === 1,
      'the moved-back job to be dead-lettered again',
    );
    const moved = (await jobs('evt_dead')).find((job) => job.id === jobId);
    expect(moved?.key).toBe(original.id);
    expect(await claims(TX_WORKER_SCOPE)).toContainEqual({
      event_key: original.id,
      status: 'failed',
      attempts: 8,
    });
    expect((await claims(TX_WORKER_SCOPE)).map((claim) => claim.event_key)).not.toContain(jobId);
  });

  it.each([
    ['empty', '', keyEmpty(ENQUEUED)],
    ['with a newline', 'ship\norder-7', keyHasControl(ENQUEUED, '\n', 4)],
    ['with a NUL', 'ship\u0000', keyHasNul(ENQUEUED)],
    ['not a string', 42, keyNotString(ENQUEUED, 42)],
    ['of 256 characters', 'k'.repeat(256), keyTooLong(ENQUEUED, 256, 255)],
  ])(
    'a bad key (%s) rejects enqueue(): 400 naming it, and the delivery writes nothing',
    async (label, key, message) => {
      const web = await start();
      const id = `evt_bad_key_${label.replace(/\W+/g, '_')}`;
      const answer = await post(web.url, { id, job: { key } });
      expect({ status: answer.status, body: await answer.json(), written: await footprint(id) }).toEqual({
        status: 400,
        body: expect.objectContaining({ statusCode: 400, message }),
        written: { claims: 0, orders: 0, jobs: 0 },
      });
    },
  );
});
