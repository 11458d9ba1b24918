import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { lastValueFrom } from 'rxjs';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { IdempotencyContext } from '../../lib/index.js';
import { IdempotencyUnavailableError } from '../../lib/errors/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import {
  crashBeforeCommit,
  deliveryOutcome,
  ExactlyOnceError,
  expectCrashRecovery,
  expectOneEffect,
  expireLease,
  runAsWebhookDelivery,
  type DeliveryOutcome,
  type SettledDelivery,
} from '../../lib/testing/index.js';
import { MICROSERVICE_PATTERNS } from '../fixtures/microservice.fixture.js';
import {
  HELPER_SCOPES,
  HelpersFixtureModule,
  LEDGER_SCHEMA,
  LedgerService,
} from '../fixtures/testing-helpers.fixture.js';
import { Gates, OrdersService, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls } from '../support/lease-rows.js';
import { startMicroservice, type RunningMicroservice } from '../support/microservice-app.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { FakeFulfilmentApi } from '../support/sample-downstream.js';

const EXTERNAL = 'FixtureController.external';

/** The helpers users import from `nest-idempotent-webhooks/testing`, used as they would use them. */
describe('testing helpers', () => {
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(LEDGER_SCHEMA);
    running = await startApp('express', [WebhookFixtureModule.forDatabase({ databaseUrl: db.url })]);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const ledger = (id: string) => db.count('SELECT count(*) FROM ledger_entries WHERE event_id = $1', [id]);
  /** The default judge, recording each verdict: what the helpers made of every answer. */
  const judged = () => {
    const verdicts: DeliveryOutcome[] = [];
    const answers: SettledDelivery[] = [];
    const outcome = (settled: SettledDelivery) => {
      const verdict = deliveryOutcome(settled);
      verdicts.push(verdict);
      answers.push(settled);
      return verdict;
    };
    return { verdicts, answers, outcome };
  };

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

  describe.each(onAdapter('fastify'))('expireLease (%s)', (adapter) => {
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

  describe.each(ADAPTERS)('expectOneEffect and expectCrashRecovery over HTTP (%s)', (adapter) => {
    let app: RunningApp;
    let api: FakeFulfilmentApi;

    beforeAll(async () => {
      api = await FakeFulfilmentApi.start();
      app = await startApp(adapter, [
        HelpersFixtureModule.forDatabase({ databaseUrl: db.url, downstreamUrl: api.url }),
      ]);
    });
    afterAll(async () => {
      await app?.close();
      await api?.close();
    });

    const post = (path: string, id: string) => () => request(app.url).post(`/helpers/${path}`).send({ id });
    /** Calls the downstream received for `id`. */
    const calls = (id: string) => api.callsFor(id).length;
    /** What a downstream that dedupes by Idempotency-Key applies for `id`: one effect per distinct key. */
    const applied = (id: string) => new Set(api.callsFor(id).map((call) => call.idempotencyKey)).size;
    const outcomes = (scope: string) => ({ ...app.app.get(IdempotencyMetrics).snapshot().claims[scope] });
    const dataSource = () => app.app.get(DataSource);

    it("pass on a transaction-mode handler that writes through the claim's manager", async () => {
      const id = `evt_helpers_ledger_${adapter}`;
      const before = outcomes(HELPER_SCOPES.ledger);
      await expectOneEffect({ deliver: post('ledger', id), effect: () => ledger(id) });
      expect(await ledger(id)).toBe(1);
      // The five first copies raced: one claimed, four replayed after it; then one more replay.
      const after = outcomes(HELPER_SCOPES.ledger);
      expect((after.claimed ?? 0) - (before.claimed ?? 0)).toBe(1);
      expect((after.replayed ?? 0) - (before.replayed ?? 0)).toBe(5);

      const crashed = `evt_helpers_ledger_crash_${adapter}`;
      const crash = judged();
      await expectCrashRecovery({
        deliver: post('ledger', crashed),
        effect: () => ledger(crashed),
        scope: HELPER_SCOPES.ledger,
        key: crashed,
        outcome: crash.outcome,
      });
      // The crashed delivery was told to retry; the redelivery and the one after it were delivered.
      expect(crash.verdicts).toEqual(['retry', 'delivered', 'delivered']);
      expect(crash.answers[0]).toMatchObject({ resolved: true, value: { status: 503 } });
      expect(await ledger(crashed)).toBe(1);
      // The crashed delivery left no claim: the redelivery was the first to commit one.
      expect(await claimRow(db, HELPER_SCOPES.ledger, crashed)).toMatchObject({
        status: 'done',
        attempts: 1,
      });
    });

    it('pass on an external-mode handler whose downstream dedupes by Idempotency-Key', async () => {
      const id = `evt_helpers_charge_${adapter}`;
      // Calls, not keys: without a crash the library must make exactly one call.
      const before = outcomes(HELPER_SCOPES.charge);
      await expectOneEffect({ deliver: post('charge', id), effect: () => calls(id) });
      expect(api.callsFor(id)).toEqual([{ idempotencyKey: id, body: { eventId: id } }]);
      // One lease; the other copies were told 409 while it was held, and redelivered until replayed.
      const after = outcomes(HELPER_SCOPES.charge);
      expect((after.claimed ?? 0) - (before.claimed ?? 0)).toBe(1);
      expect((after.replayed ?? 0) - (before.replayed ?? 0)).toBe(5);

      const crashed = `evt_helpers_charge_crash_${adapter}`;
      const crash = judged();
      await expectCrashRecovery({
        deliver: post('charge', crashed),
        effect: () => applied(crashed),
        external: true,
        dataSource: dataSource(),
        scope: HELPER_SCOPES.charge,
        key: crashed,
        outcome: crash.outcome,
      });
      expect(crash.verdicts).toEqual(['retry', 'delivered', 'delivered']);
      expect(crash.answers[0]).toMatchObject({ resolved: true, value: { status: 503 } });
      // The crash came after the call: it was made again, with the same key, so applied once.
      expect(api.callsFor(crashed)).toEqual([
        { idempotencyKey: crashed, body: { eventId: crashed } },
        { idempotencyKey: crashed, body: { eventId: crashed } },
      ]);
      expect(await claimRow(db, HELPER_SCOPES.charge, crashed)).toMatchObject({
        status: 'done',
        attempts: 2,
      });
    });

    it('expectOneEffect catches a key taken from a per-request UUID, at the race and in sequence', async () => {
      const raced = `evt_helpers_uuid_race_${adapter}`;
      const race = expectOneEffect({ deliver: post('uuid-key', raced), effect: () => ledger(raced) });
      await expect(race).rejects.toThrow(ExactlyOnceError);
      await expect(race).rejects.toThrow(
        'expectOneEffect: after 5 concurrent first deliveries, the effect counted 5, expected 1. ' +
          'Copies that ran at once each did the work: their keys differ',
      );
      expect(await ledger(raced)).toBe(5);

      const sequenced = `evt_helpers_uuid_sequence_${adapter}`;
      const failure = await expectOneEffect({
        deliver: post('uuid-key', sequenced),
        effect: () => ledger(sequenced),
        concurrent: 1,
      }).catch((error: unknown) => error);
      expect(failure).toBeInstanceOf(ExactlyOnceError);
      expect(failure).toMatchObject({ step: 'the redelivery in sequence', counted: 2 });
      expect((failure as Error).message).toContain(
        'after the redelivery in sequence, the effect counted 2, expected 1. The redelivery did the work ' +
          'again: its key is not the one the first delivery claimed',
      );
      expect(await ledger(sequenced)).toBe(2);
    });

    it("expectCrashRecovery catches a write outside the claim's transaction, which expectOneEffect lets through", async () => {
      // Without a crash the mistake is invisible: the claim commits right after the write.
      const quiet = `evt_helpers_autocommit_${adapter}`;
      await expectOneEffect({ deliver: post('autocommit', quiet), effect: () => ledger(quiet) });

      const id = `evt_helpers_autocommit_crash_${adapter}`;
      const failure = await expectCrashRecovery({
        deliver: post('autocommit', id),
        effect: () => ledger(id),
        scope: HELPER_SCOPES.autocommit,
        key: id,
      }).catch((error: unknown) => error);
      expect(failure).toBeInstanceOf(ExactlyOnceError);
      expect(failure).toMatchObject({ step: 'the crashed delivery', counted: 1 });
      expect((failure as Error).message).toContain(
        'expectCrashRecovery: after the crashed delivery, the effect counted 1, expected 0: its transaction ' +
          'rolled back, yet the effect stayed. The handler writes outside the claim',
      );
      // What the helper predicted: the claim is gone, the write is not, and the redelivery repeats it.
      expect(await claimRow(db, HELPER_SCOPES.autocommit, id)).toBeUndefined();
      expect((await post('autocommit', id)()).status).toBe(200);
      expect(await ledger(id)).toBe(2);
    });

    it('expectCrashRecovery catches an external handler that sends a fresh Idempotency-Key per call', async () => {
      const id = `evt_helpers_charge_uuid_${adapter}`;
      const failure = await expectCrashRecovery({
        deliver: post('charge-uuid', id),
        effect: () => applied(id),
        external: true,
        dataSource: dataSource(),
        scope: HELPER_SCOPES.chargeUuid,
        key: id,
      }).catch((error: unknown) => error);
      expect(failure).toBeInstanceOf(ExactlyOnceError);
      expect(failure).toMatchObject({ step: 'the redelivery', counted: 2 });
      expect((failure as Error).message).toContain(
        'after the redelivery, the effect counted 2, expected 1. The work ran again on the ' +
          'redelivery, as it must in external mode (the crash came after it), and the downstream applied it ' +
          'twice: it does not dedupe by the key it is sent',
      );
      const keys = api.callsFor(id).map((call) => call.idempotencyKey);
      expect(keys).toHaveLength(2);
      expect(keys[0]).not.toBe(keys[1]);
    });

    it('expectCrashRecovery says so when the crash never fired, or the crashed delivery was taken for a success', async () => {
      const id = `evt_helpers_wrong_scope_${adapter}`;
      const missed = expectCrashRecovery({
        deliver: post('ledger', id),
        effect: () => ledger(id),
        scope: 'Ledger.wrongScope',
      });
      await expect(missed).rejects.toThrow(
        'expectCrashRecovery: the crashed delivery never reached its COMMIT (it was answered 200 ' +
          `{"recorded":"${id}"}): no claimed delivery of scope "Ledger.wrongScope" ran to its end in this process.`,
      );
      // The crash did not linger armed: the next delivery of any scope commits.
      const next = `evt_helpers_after_miss_${adapter}`;
      expect((await post('ledger', next)()).status).toBe(200);
      expect(await ledger(next)).toBe(1);

      const judged = `evt_helpers_judged_${adapter}`;
      await expect(
        expectCrashRecovery({
          deliver: post('ledger', judged),
          effect: () => ledger(judged),
          outcome: () => 'delivered',
        }),
      ).rejects.toThrow(/the crashed delivery was answered 503 .*, a success, although it never committed/);
      expect(await ledger(judged)).toBe(0);
    });

    it('crashBeforeCommit: a transaction-mode delivery is answered 503 + Retry-After and writes nothing, until disarmed', async () => {
      const id = `evt_helpers_crash_${adapter}`;
      const disarm = crashBeforeCommit({ scope: HELPER_SCOPES.ledger, key: id, times: 2 });
      try {
        for (let delivery = 1; delivery <= 2; delivery++) {
          const answer = await post('ledger', id)();
          expect(answer.status).toBe(503);
          expect(answer.headers['retry-after']).toMatch(/^\d+$/);
        }
        expect(await ledger(id)).toBe(0);
        expect(await claimRow(db, HELPER_SCOPES.ledger, id)).toBeUndefined();
      } finally {
        disarm();
      }
      expect((await post('ledger', id)()).status).toBe(200);
      expect(await ledger(id)).toBe(1);

      // Disarmed before it fired: nothing crashes.
      const spared = `evt_helpers_spared_${adapter}`;
      crashBeforeCommit({ key: spared })();
      expect((await post('ledger', spared)()).status).toBe(200);
      expect(await ledger(spared)).toBe(1);
    });
  });

  describe('expectOneEffect and expectCrashRecovery on plain calls and over RPC', () => {
    let app: RunningApp;
    let api: FakeFulfilmentApi;
    let microservice: RunningMicroservice;

    beforeAll(async () => {
      api = await FakeFulfilmentApi.start();
      app = await startApp('express', [
        HelpersFixtureModule.forDatabase({ databaseUrl: db.url, downstreamUrl: api.url }),
      ]);
      microservice = await startMicroservice('tcp', { databaseUrl: db.url });
    });
    afterAll(async () => {
      await microservice?.close();
      await app?.close();
      await api?.close();
    });

    it('an @Idempotent method: a crash rejects with IdempotencyUnavailableError, judged "retry"', async () => {
      const ledgerService = app.app.get(LedgerService);
      const id = 'evt_helpers_method';
      await expectOneEffect({ deliver: () => ledgerService.record({ id }), effect: () => ledger(id) });
      const crashed = 'evt_helpers_method_crash';
      const crash = judged();
      await expectCrashRecovery({
        deliver: () => ledgerService.record({ id: crashed }),
        effect: () => ledger(crashed),
        scope: HELPER_SCOPES.method,
        key: crashed,
        outcome: crash.outcome,
      });
      expect(crash.verdicts).toEqual(['retry', 'delivered', 'delivered']);
      expect(crash.answers[0]).toMatchObject({
        resolved: false,
        error: expect.any(IdempotencyUnavailableError),
      });
      expect(await ledger(crashed)).toBe(1);
    });

    it('a microservice message: a crash rejects with the RPC code IDEMPOTENCY_UNAVAILABLE, judged "retry"; a replay answers the stored reply', async () => {
      const send = (pattern: string, id: string) => () =>
        // The default keeps lastValueFrom from rejecting on a message that answers nothing.
        lastValueFrom(microservice.client.send(pattern, { id }), { defaultValue: undefined });
      const id = 'evt_helpers_rpc';
      await expectOneEffect({ deliver: send(MICROSERVICE_PATTERNS.order, id), effect: () => orders(id) });
      const crashed = 'evt_helpers_rpc_crash';
      const crash = judged();
      await expectCrashRecovery({
        deliver: send(MICROSERVICE_PATTERNS.order, crashed),
        effect: () => orders(crashed),
        scope: 'MicroserviceFixtureController.createOrder',
        key: crashed,
        outcome: crash.outcome,
      });
      expect(crash.verdicts).toEqual(['retry', 'delivered', 'delivered']);
      expect(crash.answers[0]).toMatchObject({
        resolved: false,
        error: { status: 'error', code: 'IDEMPOTENCY_UNAVAILABLE' },
      });
      expect(await orders(crashed)).toBe(1);

      const external = 'evt_helpers_rpc_external';
      await expectOneEffect({
        deliver: send(MICROSERVICE_PATTERNS.external, external),
        effect: () => db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [external]),
      });
    });
  });
});
