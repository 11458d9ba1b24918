import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { ExpiredLeaseReporter } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { expireLease } from '../../lib/testing/index.js';
import { RefusalsController, refusedOnPurpose } from '../fixtures/refusals.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { parkDelivery } from '../support/parked-delivery.js';

const EXTERNAL = 'RefusalsController.external';
const TRANSACTION = 'RefusalsController.transaction';
/** Poison after this many failed attempts: fewer than the refusals the poison test sends. */
const MAX_ATTEMPTS = 2;

/**
 * A handler that refuses its input with a 4xx HttpException has answered the sender on purpose:
 * in both modes that leaves no claim, so the refusal is neither a failed attempt nor, repeated,
 * a poison event, and a later delivery of the event claims attempt 1. Before, external mode kept a
 * `failed` row, counted the refusal as an attempt, and reported the event as poison once refused
 * `maxAttempts` times. A 5xx is still a failure in both modes.
 */
describe.each(ADAPTERS)('refusals (4xx) by the handler (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let controller: RefusalsController;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers: [RefusalsController],
        // The reporter runs when a test calls it.
        idempotency: { maxAttempts: MAX_ATTEMPTS, reportEveryMs: 3_600_000 },
      }),
    ]);
    controller = running.app.get(RefusalsController);
  });

  afterEach(() => running?.app.get(Gates).openAll());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const post = (path: string, body: object) =>
    request(running.url)
      .post(path)
      .send(body)
      .then((answer) => answer);
  const claims = (scope: string, id: string) =>
    db.pool
      .query('SELECT status, attempts FROM processed_events WHERE scope = $1 AND event_key = $2', [scope, id])
      .then((result) => result.rows as { status: string; attempts: number }[]);
  const outcomes = (scope: string) => running.app.get(IdempotencyMetrics).snapshot().claims[scope] ?? {};

  it.each([400, 404, 409, 422])(
    'leaves no claim in external mode for a %d refusal; the next delivery claims attempt 1',
    async (status) => {
      const id = `evt_refused_${status}_${adapter}`;
      const refused = await post('/refusals/external', { id, status });
      expect(refused.status).toBe(status);
      expect(refused.body.message).toBe(refusedOnPurpose(id, status));
      expect(await claims(EXTERNAL, id)).toEqual([]);

      const accepted = await post('/refusals/external', { id });
      expect([accepted.status, accepted.body]).toEqual([200, { processed: id, attempt: 1 }]);
      expect(controller.attempts.get(id)).toEqual([1, 1]);
      expect(await claims(EXTERNAL, id)).toEqual([{ status: 'done', attempts: 1 }]);
    },
  );

  it('never makes a poison event of an event refused again and again in external mode', async () => {
    const id = `evt_refused_often_${adapter}`;
    for (let round = 0; round < MAX_ATTEMPTS + 1; round++) {
      expect((await post('/refusals/external', { id, status: 422 })).status).toBe(422);
    }
    const report = await running.app.get(ExpiredLeaseReporter).run({ force: true });
    // Seen together: the claim rows, the poison report and the attempts each refusal ran as.
    expect({
      claims: await claims(EXTERNAL, id),
      poison: report.poison.filter((claim) => claim.key === id).map((claim) => claim.attempts),
      attempts: controller.attempts.get(id),
    }).toEqual({ claims: [], poison: [], attempts: Array(MAX_ATTEMPTS + 1).fill(1) });
  });

  it('still records a 5xx HttpException in external mode as a failed attempt, re-claimed as attempt 2', async () => {
    const id = `evt_failed_500_${adapter}`;
    expect((await post('/refusals/external', { id, status: 503 })).status).toBe(503);
    expect(await claims(EXTERNAL, id)).toEqual([{ status: 'failed', attempts: 1 }]);
    const accepted = await post('/refusals/external', { id });
    expect([accepted.status, accepted.body]).toEqual([200, { processed: id, attempt: 2 }]);
    expect(await claims(EXTERNAL, id)).toEqual([{ status: 'done', attempts: 2 }]);
  });

  it('leaves a lease taken over meanwhile to its new holder when the old holder then refuses', async () => {
    const id = `evt_refused_late_${adapter}`;
    const parked = await parkDelivery(running, '/refusals/external', { id, status: 400 });
    expect(await expireLease(running.app.get(DataSource), EXTERNAL, id)).toBe(true);
    const second = await post('/refusals/external', { id });
    expect([second.status, second.body]).toEqual([200, { processed: id, attempt: 2 }]);

    parked.gates.open(id);
    expect((await parked.answer).status).toBe(400);
    // The removal is fenced by the lease token: the new holder's completion stands.
    expect(await claims(EXTERNAL, id)).toEqual([{ status: 'done', attempts: 2 }]);
    const replay = await post('/refusals/external', { id });
    expect([replay.status, replay.headers['idempotent-replayed']]).toEqual([200, 'true']);
  });

  it('leaves no claim in transaction mode either, and rolls back what the handler wrote', async () => {
    const id = `evt_refused_tx_${adapter}`;
    const before = outcomes(TRANSACTION);
    expect((await post('/refusals/transaction', { id, status: 400 })).status).toBe(400);
    expect(await claims(TRANSACTION, id)).toEqual([]);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(0);

    expect((await post('/refusals/transaction', { id })).status).toBe(200);
    expect(await claims(TRANSACTION, id)).toEqual([{ status: 'done', attempts: 1 }]);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(1);
    expect(controller.runs.get(id)).toBe(2);
    // A first claim: there was no failed claim to take back.
    expect(outcomes(TRANSACTION)).toMatchObject({ claimed: (before.claimed ?? 0) + 1 });
    expect(outcomes(TRANSACTION).reclaimed ?? 0).toBe(before.reclaimed ?? 0);
  });
});
