import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import {
  IdempotencyContext,
  IdempotencyService,
  type IdempotentDelivery,
  type IdempotentRunOptions,
} from '../../lib/index.js';
import {
  EventInFlightError,
  IdempotencyUnavailableError,
  InvalidIdempotencyKeyError,
} from '../../lib/errors/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow } from '../support/lease-rows.js';
import { LogCapture } from '../support/log-capture.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { startPostgres, type PostgresServer } from '../support/postgres-server.js';
import { waitUntil } from '../support/wait-until.js';

/** Short, so a transaction-mode duplicate is answered in flight quickly. */
const DUPLICATE_WAIT_MS = 300;
const RETRY_AFTER_SECONDS = 30;
const LEASE_MS = 20_000;

const inFlight = (key: string) => `Event ${key} is being processed by another delivery; retry later`;

/** A run's callback parked until released, and a flag to wait on (bounded) that it got there. */
function parkedWork() {
  let release!: () => void;
  const released = new Promise<void>((done) => (release = done));
  const state = { entered: false, release, deliveries: [] as IdempotentDelivery[] };
  return Object.assign(state, {
    fn: async (delivery: IdempotentDelivery) => {
      state.deliveries.push(delivery);
      state.entered = true;
      await released;
      return 'finished';
    },
    arrived: () => waitUntil(() => state.entered, 'the parked run to start its work'),
  });
}

/** Counts its calls: a run that must not call it shows it did. */
function countingWork<T>(value: T) {
  const work = Object.assign(
    async (delivery: IdempotentDelivery) => {
      work.calls.push(delivery);
      return value;
    },
    { calls: [] as IdempotentDelivery[] },
  );
  return work;
}

/**
 * `IdempotencyService.run`, the programmatic entry point, against real Postgres in the fixture
 * app that also serves HTTP: the same claim, the same errors and messages, the same counters.
 */
describe('IdempotencyService.run', () => {
  let db: TestDatabase;
  let running: RunningApp;
  let service: IdempotencyService;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp('express', [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        idempotency: { concurrentDuplicateWaitMs: DUPLICATE_WAIT_MS, retryAfterSeconds: RETRY_AFTER_SECONDS },
      }),
    ]);
    running.app.useLogger(new LogCapture());
    service = running.app.get(IdempotencyService);
  });

  // A failed assertion must not leave an HTTP handler parked: its app could not close.
  afterEach(() => running?.app.get(Gates).openAll());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const written = async () => ({
    claims: await db.count('SELECT count(*) FROM processed_events'),
    orders: await db.count('SELECT count(*) FROM orders'),
  });

  it('resolves processed with the value once, then replayed without calling fn', async () => {
    const key = 'evt_run_once';
    const work = countingWork({ total: 42 });
    const insert = async (delivery: IdempotentDelivery) => {
      await delivery.manager.query('INSERT INTO orders (event_id) VALUES ($1)', [delivery.key]);
      return work(delivery);
    };

    expect(await service.run({ scope: 'svc.once', key }, insert)).toEqual({
      status: 'processed',
      value: { total: 42 },
    });
    expect(await service.run({ scope: 'svc.once', key }, insert)).toEqual({ status: 'replayed' });
    expect(work.calls).toHaveLength(1);
    expect(await orders(key)).toBe(1);
    expect(await claimRow(db, 'svc.once', key)).toMatchObject({ status: 'done' });
    // A synchronous fn is fine too; another scope is another claim of the same key.
    expect(await service.run({ scope: 'svc.once-sync', key }, () => 7)).toEqual({
      status: 'processed',
      value: 7,
    });
  });

  it('hands fn the delivery: in transaction mode, the claim’s transaction and no lease', async () => {
    const key = 'evt_run_delivery_tx';
    const context = running.app.get(IdempotencyContext);
    let seen: Record<string, unknown> | undefined;
    const result = await service.run({ scope: 'svc.delivery', key, source: 'billing' }, async (delivery) => {
      await delivery.manager.query('INSERT INTO orders (event_id) VALUES ($1)', [key]);
      const { scope, source, mode, leaseToken, attempt, extendLease } = delivery;
      seen = {
        key: delivery.key,
        scope,
        source,
        mode,
        leaseToken,
        attempt,
        extendLease,
        inTransaction: delivery.manager.queryRunner?.isTransactionActive,
        // Services the work calls see the same delivery through IdempotencyContext.
        context: {
          key: context.key,
          scope: context.scope,
          sameManager: context.manager === delivery.manager,
        },
      };
      // Uncommitted until fn returns: the claim and the insert commit together.
      return { visibleOutside: await orders(key) };
    });

    expect(result).toEqual({ status: 'processed', value: { visibleOutside: 0 } });
    expect(seen).toMatchObject({
      key,
      scope: 'svc.delivery',
      source: 'billing',
      mode: 'transaction',
      leaseToken: undefined,
      attempt: undefined,
      extendLease: undefined,
      inTransaction: true,
      context: { key, scope: 'svc.delivery', sameManager: true },
    });
    expect(await orders(key)).toBe(1);
    expect(await claimRow(db, 'svc.delivery', key)).toMatchObject({ status: 'done', source: 'billing' });
  });

  it.each([
    ["mode: 'external'", { mode: 'external' }],
    ['external: true', { external: true }],
  ] as const)(
    'runs %s under a fenced lease: fn gets its token, attempt and extendLease',
    async (name, modeOption) => {
      const key = `evt_run_external_${name.replace(/\W+/g, '_')}`;
      const scope = 'svc.external';
      let seen: Record<string, unknown> | undefined;
      const result = await service.run({ scope, key, ...modeOption, leaseMs: LEASE_MS }, async (delivery) => {
        const claimed = await claimRow(db, scope, key);
        const extended = await delivery.extendLease!(LEASE_MS * 3);
        const after = await claimRow(db, scope, key);
        seen = {
          key: delivery.key,
          scope: delivery.scope,
          mode: delivery.mode,
          attempt: delivery.attempt,
          leaseToken: delivery.leaseToken,
          extendLease: delivery.extendLease,
          // External mode holds no claim transaction: no manager to write through by mistake.
          manager: (() => {
            try {
              return delivery.manager;
            } catch (error) {
              return (error as Error).message;
            }
          })(),
          claimed,
          extended,
          moved: after!.lease_expires_at! > claimed!.lease_expires_at!,
        };
        return 'called';
      });

      expect(result).toEqual({ status: 'processed', value: 'called' });
      expect(seen).toMatchObject({
        key,
        scope,
        mode: 'external',
        attempt: 1,
        leaseToken: expect.stringMatching(/^[0-9a-f-]{36}$/),
        extendLease: expect.any(Function),
        manager: `${scope} runs in external mode, which holds no claim transaction: there is no manager whose writes commit with the claim. Write through your own repository or DataSource (autocommitted, not fenced: keep such writes idempotent on their own), or use transaction mode for database work.`,
        claimed: { status: 'in_progress', attempts: 1 },
        extended: true,
        moved: true,
      });
      expect((seen!.claimed as { lease_token: string }).lease_token).toBe(seen!.leaseToken);
      expect(await claimRow(db, scope, key)).toMatchObject({ status: 'done', attempts: 1 });
      expect(await service.run({ scope, key, ...modeOption }, () => 'again')).toEqual({ status: 'replayed' });
    },
  );

  it('re-runs fn after it threw in external mode, on the next attempt', async () => {
    const key = 'evt_run_external_retry';
    const scope = 'svc.external-retry';
    await expect(
      service.run({ scope, key, external: true }, () => {
        throw new Error('the API answered 502');
      }),
    ).rejects.toThrow('the API answered 502');
    expect(await claimRow(db, scope, key)).toMatchObject({
      status: 'failed',
      last_error: 'the API answered 502',
    });
    const work = countingWork('charged');
    expect(await service.run({ scope, key, external: true }, work)).toEqual({
      status: 'processed',
      value: 'charged',
    });
    expect(work.calls.map((delivery) => delivery.attempt)).toEqual([2]);
  });

  it('rejects a duplicate of a run in flight with EventInFlightError, in both modes', async () => {
    for (const mode of ['external', 'transaction'] as const) {
      const key = `evt_run_busy_${mode}`;
      const scope = `svc.busy-${mode}`;
      const options: IdempotentRunOptions = {
        scope,
        key,
        mode,
        ...(mode === 'external' && { leaseMs: LEASE_MS }),
      };
      const parked = parkedWork();
      const first = service.run(options, parked.fn);
      await parked.arrived();

      const duplicate = countingWork('twice');
      const error = await service.run(options, duplicate).catch((rejection: unknown) => rejection);
      expect(error).toBeInstanceOf(EventInFlightError);
      expect(error).toMatchObject({ code: 'IDEMPOTENCY_IN_FLIGHT', message: inFlight(key), scope, key });
      const { retryAfterSeconds } = error as EventInFlightError;
      if (mode === 'external') {
        // What is left of the holder's lease, in whole seconds.
        expect(retryAfterSeconds).toBeGreaterThanOrEqual(1);
        expect(retryAfterSeconds).toBeLessThanOrEqual(LEASE_MS / 1000);
      } else {
        expect(retryAfterSeconds).toBe(RETRY_AFTER_SECONDS);
      }
      expect(duplicate.calls).toHaveLength(0);

      parked.release();
      expect(await first).toEqual({ status: 'processed', value: 'finished' });
      expect(await service.run(options, duplicate)).toEqual({ status: 'replayed' });
      expect(duplicate.calls).toHaveLength(0);
    }
  });

  it('rejects bad keys with InvalidIdempotencyKeyError and the message HTTP answers, writing nothing', async () => {
    const cases: [string, unknown][] = [
      ['empty', ''],
      ['too long', 'k'.repeat(300)],
      ['NUL', 'evt_\u0000nul'],
      ['lone surrogate', 'evt_\ud800'],
      ['a number', 42],
      ['null', null],
    ];
    // The same scope as POST /orders, so the two messages can be compared whole.
    const scope = 'FixtureController.order';
    const work = countingWork('never');
    const before = await written();
    const messages: Record<string, string> = {};
    for (const [kind, key] of cases) {
      const error = await service.run({ scope, key }, work).catch((rejection: unknown) => rejection);
      expect(error).toBeInstanceOf(InvalidIdempotencyKeyError);
      expect(error).toMatchObject({ code: 'IDEMPOTENCY_INVALID_KEY', scope, key: undefined });
      const answer = await request(running.url).post('/orders').send({ id: key });
      expect({ kind, status: answer.status }).toEqual({ kind, status: 400 });
      expect({ kind, message: (error as Error).message }).toEqual({ kind, message: answer.body.message });
      messages[kind] = (error as Error).message;
    }
    expect(messages).toEqual({
      empty: `Idempotency key of ${scope} is empty`,
      'too long': `Idempotency key of ${scope} is 300 characters long; the maximum is 255`,
      NUL: `Idempotency key of ${scope} contains a NUL character, which PostgreSQL text cannot store`,
      'lone surrogate': `Idempotency key of ${scope} contains a lone UTF-16 surrogate; stored as UTF-8 it would become U+FFFD and collide with other keys`,
      'a number': `Idempotency key of ${scope} must be a string, got number`,
      null: `Idempotency key of ${scope} must be a string, got null`,
    });
    expect(work.calls).toHaveLength(0);
    expect(await written()).toEqual(before);
  });

  it('rejects bad options with a TypeError naming the mistake, writing nothing', async () => {
    const work = countingWork('never');
    const before = await written();
    const cases: [unknown, string][] = [
      [undefined, 'IdempotencyService.run needs options with a scope, e.g. { scope: "billing", key }'],
      [{ key: 'k' }, 'IdempotencyService.run needs options with a scope, e.g. { scope: "billing", key }'],
      [{ scope: '', key: 'k' }, 'IdempotencyService.run scope must be a non-empty string'],
      [
        { scope: 'svc.opts', key: 'k', mode: 'lease' },
        "IdempotencyService.run mode must be one of 'transaction', 'external', got lease",
      ],
      [
        { scope: 'svc.opts', key: 'k', leaseMs: 1_000 },
        "IdempotencyService.run leaseMs and heartbeat belong to external mode; add mode: 'external' or remove them",
      ],
      [
        { scope: 'svc.opts', key: 'k', mode: 'transaction', heartbeat: true },
        "IdempotencyService.run leaseMs and heartbeat belong to external mode; add mode: 'external' or remove them",
      ],
      [
        { scope: 'svc.opts', key: 'k', external: true, mode: 'transaction' },
        "IdempotencyService.run external: true contradicts mode: 'transaction'; give one of them",
      ],
      [
        { scope: 'svc.opts', key: 'k', external: false, mode: 'external' },
        "IdempotencyService.run external: false contradicts mode: 'external'; give one of them",
      ],
      [
        { scope: 'svc.opts', key: 'k', external: true, leaseMs: -5 },
        'IdempotencyService.run leaseMs must be a positive number of milliseconds, got -5',
      ],
    ];
    for (const [options, message] of cases) {
      const error = await service
        .run(options as IdempotentRunOptions, work)
        .catch((rejection: unknown) => rejection);
      expect({ options, error }).toEqual({ options, error: new TypeError(message) });
      expect(error).toBeInstanceOf(TypeError);
    }
    expect(work.calls).toHaveLength(0);
    expect(await written()).toEqual(before);
  });

  it('counts the same outcomes as an HTTP handler doing the same, in both modes', async () => {
    const metrics = running.app.get(IdempotencyMetrics);
    const post = (path: string, body: object) => request(running.url).post(path).send(body);

    // External mode over HTTP: claimed, replayed, in flight, failed, re-claimed.
    expect((await post('/external', { id: 'evt_m_ext' })).status).toBe(200);
    expect((await post('/external', { id: 'evt_m_ext' })).headers['idempotent-replayed']).toBe('true');
    const parkedHttp = await parkDelivery(running, '/external', { id: 'evt_m_ext_busy' });
    expect((await post('/external', { id: 'evt_m_ext_busy' })).status).toBe(409);
    parkedHttp.gates.open('evt_m_ext_busy');
    expect((await parkedHttp.answer).status).toBe(200);
    expect((await post('/external', { id: 'evt_m_ext_fail', fail: true })).status).toBe(500);
    expect((await post('/external', { id: 'evt_m_ext_fail' })).body.attempt).toBe(2);

    // The same through run().
    const external = { scope: 'svc.metrics-external', external: true } as const;
    const ok = () => 'ok';
    await service.run({ ...external, key: 'evt_m_ext' }, ok);
    await service.run({ ...external, key: 'evt_m_ext' }, ok);
    const parkedRun = parkedWork();
    const holder = service.run({ ...external, key: 'evt_m_ext_busy' }, parkedRun.fn);
    await parkedRun.arrived();
    await expect(service.run({ ...external, key: 'evt_m_ext_busy' }, ok)).rejects.toBeInstanceOf(
      EventInFlightError,
    );
    parkedRun.release();
    await holder;
    await expect(
      service.run({ ...external, key: 'evt_m_ext_fail' }, () => Promise.reject(new Error('failed'))),
    ).rejects.toThrow('failed');
    expect(await service.run({ ...external, key: 'evt_m_ext_fail' }, ok)).toEqual({
      status: 'processed',
      value: 'ok',
    });

    // Transaction mode over HTTP: claimed, replayed, in flight (past concurrentDuplicateWaitMs),
    // failed (rolled back), then claimed afresh.
    expect((await post('/orders', { id: 'evt_m_tx' })).status).toBe(200);
    expect((await post('/orders', { id: 'evt_m_tx' })).headers['idempotent-replayed']).toBe('true');
    const parkedOrder = await parkDelivery(running, '/orders', { id: 'evt_m_tx_busy' });
    expect((await post('/orders', { id: 'evt_m_tx_busy' })).status).toBe(409);
    parkedOrder.gates.open('evt_m_tx_busy');
    expect((await parkedOrder.answer).status).toBe(200);
    expect((await post('/orders', { id: 'evt_m_tx_fail', fail: true })).status).toBe(500);
    expect((await post('/orders', { id: 'evt_m_tx_fail' })).status).toBe(200);

    const transaction = { scope: 'svc.metrics-transaction' } as const;
    await service.run({ ...transaction, key: 'evt_m_tx' }, ok);
    await service.run({ ...transaction, key: 'evt_m_tx' }, ok);
    const parkedTx = parkedWork();
    const txHolder = service.run({ ...transaction, key: 'evt_m_tx_busy' }, parkedTx.fn);
    await parkedTx.arrived();
    await expect(service.run({ ...transaction, key: 'evt_m_tx_busy' }, ok)).rejects.toBeInstanceOf(
      EventInFlightError,
    );
    parkedTx.release();
    await txHolder;
    await expect(
      service.run({ ...transaction, key: 'evt_m_tx_fail' }, () => Promise.reject(new Error('failed'))),
    ).rejects.toThrow('failed');
    await service.run({ ...transaction, key: 'evt_m_tx_fail' }, ok);

    const { claims } = metrics.snapshot();
    expect(claims['FixtureController.external']).toEqual({
      claimed: 3,
      replayed: 1,
      in_flight: 1,
      failed: 1,
      reclaimed: 1,
    });
    expect(claims['svc.metrics-external']).toEqual(claims['FixtureController.external']);
    // The delivery after the failure takes the failed claim back: reclaimed, as in external mode.
    expect(claims['FixtureController.order']).toEqual({
      claimed: 2,
      reclaimed: 1,
      replayed: 1,
      in_flight: 1,
      failed: 1,
    });
    expect(claims['svc.metrics-transaction']).toEqual(claims['FixtureController.order']);
  });
});

/**
 * The database stopped (a server of this test's own, as in outage.e2e-spec.ts): run() rejects
 * with IdempotencyUnavailableError in both modes, never resolves replayed or processed, and calls
 * no fn it could not claim for.
 */
describe('IdempotencyService.run with the database down', () => {
  let server: PostgresServer;
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    server = await startPostgres({ reuseDatabaseUrl: false });
    db = await createTestDatabase(server.adminUrl);
    running = await startApp('express', [WebhookFixtureModule.forDatabase({ databaseUrl: db.url })]);
    running.app.useLogger(new LogCapture());
  }, 120_000);

  afterAll(async () => {
    await running?.close();
    // The database went with its server: only the test's pool is left to close.
    await db?.pool.end();
    await server?.stop();
  });

  it('rejects with IdempotencyUnavailableError, from a parked commit and for new and done keys', async () => {
    const service = running.app.get(IdempotencyService);
    const scope = 'svc.outage';
    for (const external of [false, true]) {
      expect(await service.run({ scope, key: `evt_before_${external}`, external }, () => 'ok')).toEqual({
        status: 'processed',
        value: 'ok',
      });
    }

    // Parked inside its transaction when the database goes: its commit cannot happen.
    const parked = parkedWork();
    const cut = service
      .run({ scope, key: 'evt_parked' }, async (delivery) => {
        await delivery.manager.query('INSERT INTO orders (event_id) VALUES ($1)', ['evt_parked']);
        return parked.fn(delivery);
      })
      .catch((rejection: unknown) => rejection);
    await parked.arrived();
    await server.stop();
    parked.release();
    expect(await cut).toBeInstanceOf(IdempotencyUnavailableError);

    const work = countingWork('never');
    for (const external of [false, true]) {
      for (const key of [`evt_during_${external}`, `evt_before_${external}`]) {
        const error = await service
          .run({ scope, key, external }, work)
          .catch((rejection: unknown) => rejection);
        expect({ external, key, error }).toEqual({
          external,
          key,
          error: expect.any(IdempotencyUnavailableError),
        });
        expect(error).toMatchObject({
          code: 'IDEMPOTENCY_UNAVAILABLE',
          message: `Could not record event ${key}: the database is unavailable; retry later`,
          scope,
          key,
          retryAfterSeconds: RETRY_AFTER_SECONDS,
          sqlState: 'ECONNREFUSED',
        });
      }
    }
    expect(work.calls).toHaveLength(0);
  });
});
