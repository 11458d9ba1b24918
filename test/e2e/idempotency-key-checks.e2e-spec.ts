import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { KeyChecksFixtureController, type ChargeEvent } from '../fixtures/key-checks.fixture.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';

/**
 * The seed's two key mistakes, made on purpose against real webhook routes, and what the key
 * checks report: a key on the object id swallows a charge's second event (key_conflict: replayed
 * and warned by default, 422 when strict), and a key taken at arrival makes every copy new
 * (key_unstable). Each is logged once per handler and counted every time.
 */
describe.each(ADAPTERS)('webhook key checks (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  const logs = new LogCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        idempotency: { detectUnstableKeys: true },
        controllers: [KeyChecksFixtureController],
      }),
    ]);
    running.app.useLogger(logs);
  });

  beforeEach(() => logs.clear());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const charge = (id: string, type: string, object: string, pending = 1): ChargeEvent => ({
    id,
    type,
    pending_webhooks: pending,
    data: { object: { id: object, amount: 500 } },
  });
  const send = (path: string, event: ChargeEvent) => request(running.url).post(`/keys/${path}`).send(event);
  const ran = (scope: string, id: string) =>
    db.count(`SELECT count(*) FROM orders WHERE event_id LIKE $1 || ':%'`, [`${scope}:${id}`]);
  const counted = (scope: string, outcome: 'key_conflict' | 'key_unstable') =>
    running.app.get(IdempotencyMetrics).snapshot().claims[scope]?.[outcome] ?? 0;

  it('same key, different event (keyed on the object id): replayed, warned once, counted each time', async () => {
    const scope = 'KeyChecksFixtureController.object';
    const object = `ch_${adapter}_1`;
    expect((await send('object', charge(`evt_${adapter}_a`, 'charge.succeeded', object))).status).toBe(200);
    const second = await send('object', charge(`evt_${adapter}_b`, 'charge.captured', object));
    expect(second.status).toBe(200);
    expect(second.headers['idempotent-replayed']).toBe('true');
    // The mistake's effect: the second event did not run. The check makes it seen.
    expect(await ran(scope, `evt_${adapter}_b`)).toBe(0);
    const third = await send('object', charge(`evt_${adapter}_c`, 'charge.refunded', object));
    expect(third.headers['idempotent-replayed']).toBe('true');
    expect(counted(scope, 'key_conflict')).toBe(2);
    const warnings = logs.find('warn', scope, 'another fingerprint', 'key_conflict');
    expect(warnings).toHaveLength(1);
    expect(warnings[0].message).toContain(object);
  });

  it('a copy of the same event (Stripe counts pending_webhooks down) is no conflict', async () => {
    const scope = 'KeyChecksFixtureController.event';
    const first = await send(
      'event',
      charge(`evt_${adapter}_copy`, 'charge.succeeded', `ch_${adapter}_2`, 3),
    );
    const copy = await send('event', charge(`evt_${adapter}_copy`, 'charge.succeeded', `ch_${adapter}_2`, 2));
    expect(first.status).toBe(200);
    expect(copy.headers['idempotent-replayed']).toBe('true');
    expect(counted(scope, 'key_conflict')).toBe(0);
    expect(logs.find('warn', 'another fingerprint')).toHaveLength(0);
  });

  it('strict (onKeyConflict: refuse): the second event is answered 422 and runs nothing', async () => {
    const scope = 'KeyChecksFixtureController.objectStrict';
    const object = `ch_${adapter}_3`;
    expect(
      (await send('object-strict', charge(`evt_${adapter}_s1`, 'charge.succeeded', object))).status,
    ).toBe(200);
    const refused = await send('object-strict', charge(`evt_${adapter}_s2`, 'charge.captured', object));
    expect(refused.status).toBe(422);
    // Webhook answers keep Nest's shape (not problem details).
    expect(refused.headers['content-type']).toMatch(/^application\/json/);
    expect(refused.body).toMatchObject({ statusCode: 422, error: 'Unprocessable Content' });
    expect(await ran(scope, `evt_${adapter}_s2`)).toBe(0);
    expect(counted(scope, 'key_conflict')).toBe(1);
    expect(logs.find('warn', scope, 'Refused 422')).toHaveLength(1);
  });

  it('same event, different key (a key taken at arrival): both copies run, warned once, counted', async () => {
    const scope = 'KeyChecksFixtureController.arrival';
    const id = `evt_${adapter}_arrival`;
    // Two copies of one event, as Stripe resends it: only pending_webhooks differs.
    expect((await send('arrival', charge(id, 'charge.succeeded', `ch_${adapter}_4`, 2))).status).toBe(200);
    expect((await send('arrival', charge(id, 'charge.succeeded', `ch_${adapter}_4`, 1))).status).toBe(200);
    expect((await send('arrival', charge(id, 'charge.succeeded', `ch_${adapter}_4`, 1))).status).toBe(200);
    // The mistake's effect: every copy ran. The check makes it seen.
    expect(await ran(scope, id)).toBe(3);
    expect(counted(scope, 'key_unstable')).toBe(2);
    const warnings = logs.find('warn', scope, 'key_unstable');
    expect(warnings).toHaveLength(1);
    expect(warnings[0].message).toContain('changes between copies');
  });
});
