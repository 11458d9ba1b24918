import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import type { HandoffOptions } from '../../lib/index.js';
import {
  JOB_DATA_QUEUE,
  JOB_DATA_SCOPE,
  JobDataController,
  JobDataFixtureModule,
  type JobDataKind,
} from '../fixtures/handoff-job-data.fixture.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/** pg-boss's schema in this file. */
const SCHEMA = 'job_data_jobs';
const HANDOFF: HandoffOptions = { schema: SCHEMA, queues: { [JOB_DATA_QUEUE]: {} } };

/** What enqueue()'s TypeError says, by kind of data. */
const REASONS: [Exclude<JobDataKind, 'fine'>, string][] = [
  ['deep', 'nests too deeply to be serialised'],
  ['cycle', 'circular structure'],
  ['nul', 'holds a NUL character or a lone UTF-16 surrogate, which jsonb refuses'],
  ['surrogate', 'holds a NUL character or a lone UTF-16 surrogate, which jsonb refuses'],
];

/**
 * A job's data that a jsonb column cannot store (nested 40,000 deep, a cycle, a NUL, a lone
 * surrogate) is refused by `IdempotencyContext.enqueue()` itself, at once, with a TypeError
 * saying why: the handler fails (500), nothing is written and the claim is recorded failed, as for
 * any handler error. Before, enqueue() resolved with a job id and the COMMIT the job was sent with
 * failed: a 503 that blamed the database, retried by the sender forever.
 */
describe.each(onAdapter('express'))('enqueue() of job data jsonb cannot store (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [JobDataFixtureModule.forDatabase(db.url, HANDOFF)]);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const jobs = (id: string) =>
    db.count(`SELECT count(*) FROM ${SCHEMA}.job WHERE data->'event'->>'key' = $1`, [id]);
  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const claim = (id: string) =>
    db.pool
      .query(
        'SELECT status, attempts, last_error FROM processed_events WHERE scope = $1 AND event_key = $2',
        [JOB_DATA_SCOPE, id],
      )
      .then(
        (result) => result.rows[0] as { status: string; attempts: number; last_error: string } | undefined,
      );

  it('hands off storable data: 200, one job, one order (the set-up works)', async () => {
    const id = `evt_fine_${adapter}`;
    const answer = await request(running.url).post('/jobs').send({ id, kind: 'fine' });
    expect(answer.status).toBe(200);
    expect([await jobs(id), await orders(id)]).toEqual([1, 1]);
    expect(await claim(id)).toMatchObject({ status: 'done', attempts: 1 });
  });

  it.each(REASONS)(
    'refuses data of kind %s at enqueue() with a TypeError naming why: "%s"',
    async (kind, reason) => {
      const id = `evt_${kind}_${adapter}`;
      const answer = await request(running.url).post('/jobs').send({ id, kind });
      // Seen together: the answer, what enqueue() rejected with, and what was written.
      expect({
        status: answer.status,
        refused: running.app.get(JobDataController).refused.get(id),
        jobs: await jobs(id),
        orders: await orders(id),
        claim: await claim(id),
      }).toEqual({
        status: 500,
        refused: { name: 'TypeError', message: expect.stringContaining(reason) },
        jobs: 0,
        orders: 0,
        claim: { status: 'failed', attempts: 1, last_error: expect.stringContaining(reason) },
      });
    },
  );
});
