import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { IdempotencyContext, IdempotencyMetrics } from '../../lib/index.js';
import { expireLease, runAsWebhookDelivery } from '../../lib/testing/index.js';
import { Gates, OrdersService, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls } from '../support/lease-rows.js';
import { parkDelivery } from '../support/parked-delivery.js';

const EXTERNAL = 'FixtureController.external';

/** The helpers users import from `nest-idempotent-webhooks/testing`, used as they would use them. */
describe('testing helpers', () => {
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp('express', [WebhookFixtureModule.forDatabase({ databaseUrl: db.url })]);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);

  describe('runAsWebhookDelivery', () => {
    it('lets a service that reads IdempotencyContext write through the test transaction', async () => {
      const service = running.app.get(OrdersService);
      const id = 'evt_helper_commit';
      const result = await running.app
        .get(DataSource)
        .transaction((manager) => runAsWebhookDelivery({ key: id, manager }, () => service.create({ id })));
      expect(result).toEqual({ id });
      expect(await orders(id)).toBe(1);
      // No claim: the helper stands in for the decorator, it does not claim.
      expect(await db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [id])).toBe(0);
    });

    it('leaves commit and rollback to the test: a rolled-back transaction writes nothing', async () => {
      const service = running.app.get(OrdersService);
      const id = 'evt_helper_rollback';
      const rolledBack = new Error('roll back on purpose');
      await expect(
        running.app.get(DataSource).transaction((manager) =>
          runAsWebhookDelivery({ key: id, manager }, async () => {
            await service.create({ id });
            throw rolledBack;
          }),
        ),
      ).rejects.toBe(rolledBack);
      expect(await orders(id)).toBe(0);
    });

    it('exposes a transaction-mode delivery with its defaults, across awaits', async () => {
      const context = running.app.get(IdempotencyContext);
      const manager = running.app.get(DataSource).manager;
      const seen = await runAsWebhookDelivery({ key: 'evt_defaults', manager }, async () => {
        await new Promise((resolve) => setImmediate(resolve));
        return {
          active: context.active,
          key: context.key,
          scope: context.scope,
          manager: context.manager,
          leaseToken: context.leaseToken,
          attempt: context.attempt,
        };
      });
      expect(seen).toEqual({
        active: true,
        key: 'evt_defaults',
        scope: 'test',
        manager,
        leaseToken: undefined,
        attempt: undefined,
      });
      expect(() =>
        runAsWebhookDelivery({ key: 'evt_defaults', manager }, () => context.extendLease()),
      ).toThrow('extendLease() is only available in external mode handlers');
      // Outside, the context is as empty as outside any decorated handler.
      expect(context.active).toBe(false);
      expect(() => context.key).toThrow('IdempotencyContext used outside an idempotent handler');
    });

    it('exposes an external delivery: token, attempt 1, and a lease that is held unless the test says', async () => {
      const context = running.app.get(IdempotencyContext);
      const manager = running.app.get(DataSource).manager;
      const held = await runAsWebhookDelivery(
        { key: 'evt_external', manager, scope: 'Payments.charge', leaseToken: 'token-1' },
        async () => ({
          scope: context.scope,
          leaseToken: context.leaseToken,
          attempt: context.attempt,
          held: await context.extendLease(),
        }),
      );
      expect(held).toEqual({ scope: 'Payments.charge', leaseToken: 'token-1', attempt: 1, held: true });

      const asked: (number | undefined)[] = [];
      const lost = await runAsWebhookDelivery(
        {
          key: 'evt_external',
          manager,
          leaseToken: 'token-2',
          attempt: 3,
          extendLease: (ms) => {
            asked.push(ms);
            return Promise.resolve(false);
          },
        },
        async () => ({ attempt: context.attempt, held: await context.extendLease(5_000) }),
      );
      expect(lost).toEqual({ attempt: 3, held: false });
      expect(asked).toEqual([5_000]);
    });

    it('refuses attempt or extendLease without a leaseToken, running nothing', () => {
      const manager = running.app.get(DataSource).manager;
      let ran = false;
      const run = () => {
        ran = true;
      };
      const refusal = 'attempt and extendLease belong to external mode; set leaseToken too';
      expect(() => runAsWebhookDelivery({ key: 'evt_bad', manager, attempt: 2 }, run)).toThrow(refusal);
      expect(() =>
        runAsWebhookDelivery({ key: 'evt_bad', manager, extendLease: () => Promise.resolve(true) }, run),
      ).toThrow(refusal);
      expect(ran).toBe(false);
    });
  });

  describe.each(ADAPTERS)('expireLease (%s)', (adapter) => {
    let app: RunningApp;
    let gates: Gates;

    beforeAll(async () => {
      // A lease far longer than the test: only expireLease() can end it.
      app = await startApp(adapter, [
        WebhookFixtureModule.forDatabase({ databaseUrl: db.url, idempotency: { leaseMs: 600_000 } }),
      ]);
      gates = app.app.get(Gates);
    });
    // A failed assertion must not leave a handler parked: its app could not close.
    afterEach(() => gates?.openAll());
    afterAll(() => app?.close());

    it('ends a live lease at once: a duplicate re-claims it and the parked worker finds its lease lost', async () => {
      const id = `evt_expire_${adapter}`;
      const parked = await parkDelivery(app, '/external', { id });
      const inFlight = await request(app.url).post('/external').send({ id });
      expect(inFlight.status).toBe(409);

      expect(await expireLease(app.app.get(DataSource), EXTERNAL, id)).toBe(true);
      const reclaimed = await request(app.url).post('/external').send({ id });
      expect(reclaimed.status).toBe(200);
      expect(reclaimed.body).toEqual({ processed: id, attempt: 2 });

      gates.open(id);
      expect((await parked.answer).body).toEqual({ processed: id, attempt: 1 });
      expect(await claimRow(db, EXTERNAL, id)).toMatchObject({ status: 'done', attempts: 2 });
      expect(await downstreamCalls(db, id)).toEqual([{ attempt: 2 }, { attempt: 1 }]);
      const outcomes = app.app.get(IdempotencyMetrics).snapshot().claims[EXTERNAL];
      expect(outcomes).toMatchObject({ claimed: 1, in_flight: 1, reclaimed: 1, lease_lost: 1 });
    });

    it('changes nothing and answers false for a done claim or an unknown key', async () => {
      const id = `evt_expire_done_${adapter}`;
      expect((await request(app.url).post('/external').send({ id })).status).toBe(200);
      const done = await claimRow(db, EXTERNAL, id);

      const dataSource = app.app.get(DataSource);
      expect(await expireLease(dataSource, EXTERNAL, id)).toBe(false);
      expect(await expireLease(dataSource, EXTERNAL, `evt_never_${adapter}`)).toBe(false);
      expect(await expireLease(dataSource, 'Other.scope', id)).toBe(false);
      expect(await claimRow(db, EXTERNAL, id)).toEqual(done);
      expect(await claimRow(db, EXTERNAL, `evt_never_${adapter}`)).toBeUndefined();

      const replay = await request(app.url).post('/external').send({ id });
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(await downstreamCalls(db, id)).toEqual([{ attempt: 1 }]);
    });
  });
});
