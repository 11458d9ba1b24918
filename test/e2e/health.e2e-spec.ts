import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Get, Module, Query } from '@nestjs/common';
import { HealthCheck, HealthCheckService, TerminusModule } from '@nestjs/terminus';
import request from 'supertest';
import type { HandoffOptions } from '../../lib/index.js';
import { IdempotencyHealthIndicator } from '../../lib/observability/index.js';
import { HandoffFixtureModule } from '../fixtures/handoff.fixture.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { waitUntil } from '../support/wait-until.js';

/** A queue no worker serves: a job enqueued there waits, and its lag grows. */
const UNSERVED_QUEUE = 'health-unserved';
const HANDOFF: HandoffOptions = {
  schema: 'health_jobs',
  queues: { [UNSERVED_QUEUE]: { retryLimit: 0, expireInSeconds: 60 } },
};

/** `/health` as an app writes it: thresholds from the query string, so one app tries each. */
@Controller('health')
class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly idempotency: IdempotencyHealthIndicator,
  ) {}

  @Get()
  @HealthCheck()
  check(@Query() query: Record<string, string>) {
    const limit = (name: string) => (query[name] === undefined ? undefined : Number(query[name]));
    return this.health.check([
      () =>
        this.idempotency.isHealthy('idempotency', {
          maxPoisonEvents: limit('poison'),
          maxExpiredLeases: limit('expired'),
          maxQueueLagMs: limit('lagMs'),
        }),
    ]);
  }
}

@Module({ imports: [TerminusModule], controllers: [HealthController] })
class HealthFixtureModule {}

describe.each(ADAPTERS)('the terminus health indicator (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      HandoffFixtureModule.forSettings({
        databaseUrl: db.url,
        web: true,
        idempotency: { handoff: HANDOFF, reporter: false },
      }),
      HealthFixtureModule,
    ]);
  });

  afterEach(async () => {
    await db.pool.query(`DELETE FROM processed_events`);
    await db.pool.query(`DELETE FROM health_jobs.job WHERE name = $1`, [UNSERVED_QUEUE]);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const health = (query = '') => request(running.url).get(`/health${query}`);

  it('is up with the claims table reachable, and reports the counts and each queue', async () => {
    const answer = await health('?poison=0&expired=0&lagMs=60000');
    expect(answer.status).toBe(200);
    expect(answer.body.info.idempotency).toEqual({
      status: 'up',
      claimsTable: 'reachable',
      poisonEvents: 0,
      expiredLeases: 0,
      queues: { [UNSERVED_QUEUE]: { oldestWaitingMs: 0, deadLettered: 0 } },
    });
  });

  it('goes down for poison events and expired leases over their thresholds, and only then', async () => {
    await db.pool.query(
      `INSERT INTO processed_events (scope, event_key, source, status, attempts, last_error)
       VALUES ('Orders.handle', 'evt_h_poison', 'fixture', 'failed', 5, 'boom'),
              ('Orders.handle', 'evt_h_young', 'fixture', 'failed', 2, 'boom')`,
    );
    await db.pool.query(
      `INSERT INTO processed_events (scope, event_key, source, status, lease_token, lease_expires_at)
       VALUES ('Orders.capture', 'evt_h_dead', 'fixture', 'in_progress', gen_random_uuid(), now() - interval '1 minute')`,
    );
    // Without thresholds they are reported, and the instance stays up.
    const reported = await health();
    expect(reported.status).toBe(200);
    expect(reported.body.info.idempotency).toMatchObject({ poisonEvents: 1, expiredLeases: 1 });
    expect((await health('?poison=1&expired=1')).status).toBe(200);

    const over = await health('?poison=0&expired=0');
    expect(over.status).toBe(503);
    expect(over.body.error.idempotency).toMatchObject({
      status: 'down',
      claimsTable: 'reachable',
      problems: ['1 poison events (more than 0)', '1 expired leases (more than 0)'],
    });
  });

  it('goes down when a queue waits longer than maxQueueLagMs', async () => {
    const enqueued = await request(running.url)
      .post('/webhook')
      .send({ id: `evt_h_lag_${adapter}`, queue: UNSERVED_QUEUE });
    expect(enqueued.status).toBe(200);
    let body: any;
    await waitUntil(async () => {
      const answer = await health('?lagMs=50');
      body = answer.body;
      return answer.status === 503;
    }, 'the unserved job to wait longer than 50 ms');
    expect(body.error.idempotency.queues[UNSERVED_QUEUE].oldestWaitingMs).toBeGreaterThan(50);
    expect(body.error.idempotency.problems[0]).toMatch(
      new RegExp(`^queue ${UNSERVED_QUEUE}: its oldest job has waited \\d+ ms \\(more than 50\\)$`),
    );
  });

  it('goes down, naming the failure, when the claims table does not answer', async () => {
    await db.pool.query('ALTER TABLE processed_events RENAME TO processed_events_away');
    try {
      const answer = await health();
      expect(answer.status).toBe(503);
      expect(answer.body.error.idempotency).toMatchObject({ status: 'down', claimsTable: 'unreachable' });
      expect(answer.body.error.idempotency.problems[0]).toContain('processed_events');
    } finally {
      await db.pool.query('ALTER TABLE processed_events_away RENAME TO processed_events');
    }
  });
});
