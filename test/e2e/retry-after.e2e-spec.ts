import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { lastValueFrom, timeout } from 'rxjs';
import request from 'supertest';
import { IdempotencyService } from '../../lib/index.js';
import { EventInFlightError } from '../../lib/errors/index.js';
import { MICROSERVICE_PATTERNS } from '../fixtures/microservice.fixture.js';
import { RetryAfterController, SHORT_LEASE_MS, type PacedEvent } from '../fixtures/retry-after.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { startMicroservice, type RunningMicroservice } from '../support/microservice-app.js';
import { parkDelivery } from '../support/parked-delivery.js';

/** The module's default `retryAfterSeconds`: what a duplicate was told before any estimate. */
const RETRY_AFTER_SECONDS = 30;
/** How long a transaction-mode duplicate waits in memory before it is answered in flight: short. */
const DUPLICATE_WAIT_MS = 200;
/** Deliveries behind a scope before its duplicate is asked about: more than the 5 an estimate needs. */
const HISTORY = 10;
/** How long a fast handler works, and a slow one. */
const FAST_MS = 20;
const SLOW_MS = 2_500;

/**
 * Retry-After for a duplicate that finds its event in flight follows how long the scope's recent
 * deliveries took (95th percentile of the last 32, minus the time the holder has already spent),
 * at least 1 s, at most the lease's seconds left (external mode) or `retryAfterSeconds`
 * (transaction mode); with fewer than 5 deliveries behind a scope, it is the old value. Before, a
 * duplicate of a 20 ms handler was told 30 s in both modes, over HTTP, on the RPC transport and
 * through IdempotencyService.run alike.
 */
describe.each(ADAPTERS)('Retry-After of an in-flight duplicate over HTTP (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let controller: RetryAfterController;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers: [RetryAfterController],
        idempotency: { concurrentDuplicateWaitMs: DUPLICATE_WAIT_MS, reporter: false },
      }),
    ]);
    controller = running.app.get(RetryAfterController);
  });

  afterEach(() => running?.app.get(Gates).openAll());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const post = (route: string, event: PacedEvent) =>
    request(running.url)
      .post(`/retry/${route}`)
      .send(event)
      .then((answer) => answer);

  /** `count` deliveries of `route`, one after another, each taking `ms`; all must be processed. */
  async function history(route: string, count: number, ms: number): Promise<void> {
    for (let i = 0; i < count; i++) {
      const answer = await post(route, { id: `evt_${route}_history_${i}_${adapter}`, ms });
      expect(answer.status).toBe(200);
    }
  }

  /**
   * Parks a delivery of `route` after its claim, sends a duplicate, and resolves with the
   * duplicate's answer once the parked one has been let go and answered 200.
   */
  async function duplicateOfParked(route: string, id: string) {
    const parked = await parkDelivery(running, `/retry/${route}`, { id });
    const duplicate = await post(route, { id });
    parked.gates.open(id);
    expect((await parked.answer).status).toBe(200);
    // The duplicate did not run: the parked delivery was the only run of the event.
    expect(controller.runsOf(route, id)).toBe(1);
    return duplicate;
  }

  it.each(['external', 'transaction'])(
    'tells a duplicate Retry-After: 1 in %s mode after 10 deliveries of about 20 ms',
    async (route) => {
      await history(route, HISTORY, FAST_MS);
      const duplicate = await duplicateOfParked(route, `evt_${route}_fast_${adapter}`);
      expect(duplicate.status).toBe(409);
      expect(duplicate.headers['retry-after']).toBe('1');
    },
  );

  it.each(['unseen-external', 'unseen-transaction'])(
    'tells a duplicate the configured Retry-After on %s, with only 4 deliveries behind it',
    async (route) => {
      await history(route, 4, FAST_MS);
      const duplicate = await duplicateOfParked(route, `evt_${route}_fast_${adapter}`);
      expect(duplicate.status).toBe(409);
      // A 5-minute lease, capped at retryAfterSeconds; transaction mode: retryAfterSeconds.
      expect(duplicate.headers['retry-after']).toBe(String(RETRY_AFTER_SECONDS));
    },
  );

  it('tells a duplicate of a slow handler more than one of a fast one, and never more than its lease has left', async () => {
    // Six deliveries of each slow route, all at once: their 2.5 s overlap. Each is timed from the
    // client, whose view of a delivery is never shorter than the server's own measure of it.
    const routes = ['slow', 'slow-short-lease'];
    const answers = await Promise.all(
      routes.flatMap((route) =>
        Array.from({ length: 6 }, async (_, i) => {
          const sent = performance.now();
          const answer = await post(route, { id: `evt_${route}_history_${i}_${adapter}`, ms: SLOW_MS });
          return { route, status: answer.status, tookMs: performance.now() - sent };
        }),
      ),
    );
    expect(answers.map((answer) => answer.status)).toEqual(Array(12).fill(200));
    const slowestMs = Math.max(
      ...answers.filter((answer) => answer.route === 'slow').map((answer) => answer.tookMs),
    );

    const slow = await duplicateOfParked('slow', `evt_slow_${adapter}`);
    expect(slow.status).toBe(409);
    // About 2.5 s to go (the 95th percentile, less the few ms the holder has spent), rounded up:
    // 3 s, or more only when a loaded machine made the deliveries themselves take longer.
    const slowSeconds = Number(slow.headers['retry-after']);
    expect(slowSeconds).toBeGreaterThanOrEqual(2);
    expect(slowSeconds).toBeLessThanOrEqual(Math.ceil(slowestMs / 1000));

    // The same work under a 2 s lease: the lease runs out first, and a redelivery may claim then.
    const bounded = await duplicateOfParked('slow-short-lease', `evt_slow_short_${adapter}`);
    expect(bounded.status).toBe(409);
    const boundedSeconds = Number(bounded.headers['retry-after']);
    expect(boundedSeconds).toBeGreaterThanOrEqual(1);
    expect(boundedSeconds).toBeLessThanOrEqual(SHORT_LEASE_MS / 1000);
    expect(boundedSeconds).toBeLessThan(slowSeconds + 1);
  });

  it('tells an IdempotencyService.run() caller the same, as EventInFlightError.retryAfterSeconds, in both modes', async () => {
    const service = running.app.get(IdempotencyService);
    for (const mode of ['external', 'transaction'] as const) {
      const scope = `retry.run.${mode}.${adapter}`;
      for (let i = 0; i < HISTORY; i++) {
        const result = await service.run({ scope, key: `evt_run_${i}`, mode }, async () => {
          await new Promise((resolve) => setTimeout(resolve, FAST_MS));
          return i;
        });
        expect(result).toEqual({ status: 'processed', value: i });
      }
      let release!: () => void;
      let claimed!: () => void;
      const gate = new Promise<void>((resolve) => (release = resolve));
      const entered = new Promise<void>((resolve) => (claimed = resolve));
      const parked = service.run({ scope, key: 'evt_run_parked', mode }, async () => {
        claimed();
        await gate;
        return 'parked';
      });
      await entered;
      const duplicate = await service
        .run({ scope, key: 'evt_run_parked', mode }, () => 'duplicate')
        .then(
          (result) => ({ result }),
          (error: unknown) => ({ error }),
        );
      release();
      expect(await parked).toEqual({ status: 'processed', value: 'parked' });
      expect('error' in duplicate && duplicate.error).toBeInstanceOf(EventInFlightError);
      expect((duplicate as { error: EventInFlightError }).error.retryAfterSeconds).toBe(1);
    }
  });
});

describe('Retry-After of an in-flight duplicate on the RPC transport (tcp)', () => {
  let db: TestDatabase;
  let running: RunningMicroservice;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startMicroservice('tcp', {
      databaseUrl: db.url,
      idempotency: { concurrentDuplicateWaitMs: DUPLICATE_WAIT_MS, reporter: false },
    });
  });

  afterEach(() => running?.app.get(Gates).openAll());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  /** The reply to `data` on `pattern`: its value, or the RpcException's error. */
  const send = (pattern: string, data: object) =>
    lastValueFrom(running.client.send(pattern, data).pipe(timeout(30_000)), { defaultValue: undefined }).then(
      (value: unknown) => ({ value }),
      (error: unknown) => ({ error }),
    );

  it.each([
    ['transaction', MICROSERVICE_PATTERNS.order],
    ['external', MICROSERVICE_PATTERNS.external],
  ])(
    'sends retryAfterSeconds: 1 in the error of a duplicate in %s mode after 10 fast deliveries',
    async (mode, pattern) => {
      for (let i = 0; i < HISTORY; i++) {
        const reply = await send(pattern, { id: `evt_rpc_${mode}_history_${i}` });
        expect('value' in reply).toBe(true);
      }
      const id = `evt_rpc_${mode}_parked`;
      const gates = running.app.get(Gates);
      const parked = send(pattern, { id, block: true });
      await gates.entered(id);
      const duplicate = await send(pattern, { id });
      gates.open(id);
      expect('value' in (await parked)).toBe(true);
      expect(duplicate).toEqual({
        error: expect.objectContaining({
          status: 'error',
          code: 'IDEMPOTENCY_IN_FLIGHT',
          key: id,
          retryAfterSeconds: 1,
        }),
      });
    },
  );
});
