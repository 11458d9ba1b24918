import diagnosticsChannel from 'node:diagnostics_channel';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { IDEMPOTENCY_CHANNELS, type OutcomeChannelMessage } from '../../lib/observability/index.js';
import { SHORT_LEASE_MS } from '../fixtures/external.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { downstreamCalls, leaseExpired } from '../support/lease-rows.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { waitUntil } from '../support/wait-until.js';

const EXTERNAL = 'FixtureController.external';

describe.each(ADAPTERS)('diagnostics channels (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let gates: Gates;
  const heard: Record<string, OutcomeChannelMessage[]> = {};
  const listeners = Object.entries(IDEMPOTENCY_CHANNELS).map(([outcome, name]) => {
    const listener = (message: unknown) => (heard[outcome] ??= []).push(message as OutcomeChannelMessage);
    return { name, listener };
  });

  beforeAll(async () => {
    for (const { name, listener } of listeners) diagnosticsChannel.subscribe(name, listener);
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        idempotency: { leaseMs: SHORT_LEASE_MS, reporter: false, prometheus: false },
      }),
    ]);
    gates = running.app.get(Gates);
  });

  afterEach(() => gates?.openAll());

  afterAll(async () => {
    for (const { name, listener } of listeners) diagnosticsChannel.unsubscribe(name, listener);
    await running?.close();
    await db?.drop();
  });

  const post = (body: object) => request(running.url).post('/external').send(body);
  const heardFor = (outcome: string, key: string) => (heard[outcome] ?? []).filter((m) => m.key === key);

  it('publishes a replay, with its scope and key', async () => {
    const key = `evt_dc_replay_${adapter}`;
    expect((await post({ id: key })).status).toBe(200);
    expect(heardFor('replayed', key)).toEqual([]);
    expect((await post({ id: key })).headers['idempotent-replayed']).toBe('true');
    expect(heardFor('replayed', key)).toEqual([{ outcome: 'replayed', scope: EXTERNAL, key }]);
  });

  it('publishes a duplicate of a delivery still running', async () => {
    const key = `evt_dc_busy_${adapter}`;
    const parked = await parkDelivery(running, '/external', { id: key });
    expect((await post({ id: key })).status).toBe(409);
    expect(heardFor('in_flight', key)).toEqual([{ outcome: 'in_flight', scope: EXTERNAL, key }]);
    gates.open(key);
    expect((await parked.answer).status).toBe(200);
  });

  it('publishes a lease lost: the first holder finishes after its lease was re-claimed', async () => {
    const key = `evt_dc_lost_${adapter}`;
    const slow = await parkDelivery(running, '/external', { id: key });
    await waitUntil(() => leaseExpired(db, EXTERNAL, key), 'the lease to expire');
    expect((await post({ id: key })).body.attempt).toBe(2);
    expect(heardFor('lease_lost', key)).toEqual([]);
    gates.open(key);
    expect((await slow.answer).status).toBe(200);
    // Both holders called the downstream: what the lease_lost message warns of.
    expect(await downstreamCalls(db, key)).toHaveLength(2);
    expect(heardFor('lease_lost', key)).toEqual([{ outcome: 'lease_lost', scope: EXTERNAL, key }]);
  });
});
