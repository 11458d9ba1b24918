import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { lastValueFrom, timeout } from 'rxjs';
import type { ClaimOutcome, ClaimOutcomeEvent } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { MicroserviceFixtureController, MICROSERVICE_PATTERNS } from '../fixtures/microservice.fixture.js';
import { Gates } from '../fixtures/webhook-fixture.module.js';
import { createTestDatabase, openTransactions, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';
import {
  observe,
  startChildMicroservice,
  startMicroservice,
  TRANSPORTS,
  type ChildMicroservice,
  type Observed,
  type RunningMicroservice,
} from '../support/microservice-app.js';
import { startPostgres, type PostgresServer } from '../support/postgres-server.js';
import { waitUntil } from '../support/wait-until.js';

const { orderEvent, order, external } = MICROSERVICE_PATTERNS;

/** The handlers' default scopes ('Class.method'), as the claims and the RPC errors name them. */
const SCOPES = {
  event: 'MicroserviceFixtureController.onOrderCreated',
  message: 'MicroserviceFixtureController.createOrder',
  external: 'MicroserviceFixtureController.capturePayment',
} as const;

/**
 * How long a transaction-mode duplicate waits for the delivery holding its event before it is
 * answered IDEMPOTENCY_IN_FLIGHT. Short, so the parked-delivery test does not wait 5 s; long
 * enough that the storm's duplicates mostly see the first delivery commit.
 */
const DUPLICATE_WAIT_MS = 1_000;
/** A delivery parked at its gate is answered after the test opens it: give it longer than a plain one. */
const PARKED_DEADLINE_MS = 30_000;
/** The library's default retry delay, sent as retryAfterSeconds when the database is the problem. */
const RETRY_AFTER_SECONDS = 30;

/**
 * What a `send()` caller observes for a replayed message: the handler did not run and the
 * interceptor answers the reply the first delivery stored with its claim (key checks), so a
 * retrying caller gets the same value as the first.
 */
const replayedReply = (value: unknown): Observed => ({ values: [value] });

/** The RpcException error of the library, as a `send()` caller receives it. */
const rpcError = (
  code: string,
  scope: string,
  key: string | undefined,
  message: string,
  retryAfterSeconds?: number,
) => ({
  error: { status: 'error', code, scope, key, message, retryAfterSeconds },
});

/**
 * `@IdempotentWebhook` on `@EventPattern` and `@MessagePattern` handlers, over real TCP and Redis
 * transports on loopback, with real Postgres: one effect per message whatever the duplicates, the
 * library's errors as structured RpcException errors, and the claim rolled back by a throw, a
 * SIGKILL, or never made when the key is bad or the database is gone.
 */
describe.each(TRANSPORTS)('@IdempotentWebhook on microservice handlers (%s)', (transport) => {
  describe('in one microservice', () => {
    let db: TestDatabase;
    let running: RunningMicroservice;
    let fixture: MicroserviceFixtureController;
    let metrics: IdempotencyMetrics;
    const logger = new LogCapture();
    const outcomes: ClaimOutcomeEvent[] = [];

    beforeAll(async () => {
      db = await createTestDatabase();
      running = await startMicroservice(
        transport,
        {
          databaseUrl: db.url,
          idempotency: {
            concurrentDuplicateWaitMs: DUPLICATE_WAIT_MS,
            onOutcome: (event) => outcomes.push(event),
          },
        },
        logger,
      );
      fixture = running.app.get(MicroserviceFixtureController);
      metrics = running.app.get(IdempotencyMetrics);
    });

    afterEach(() => {
      // A failed test may leave a handler parked; the app must still close.
      running?.app.get(Gates).openAll();
      fixture?.failOnce.clear();
    });

    afterAll(async () => {
      await running?.close();
      await db?.drop();
    });

    const send = (pattern: string, data: object, timeoutMs?: number) =>
      observe(running.client.send(pattern, data), timeoutMs);
    /** Resolves once the client has handed the event to the transport (TCP socket, Redis PUBLISH). */
    const emit = (data: object) =>
      lastValueFrom(running.client.emit(orderEvent, data).pipe(timeout(10_000)), { defaultValue: undefined });
    const outcomesOf = (id: string): ClaimOutcome[] =>
      outcomes.filter((event) => event.key === id).map((event) => event.outcome);
    const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
    const claims = (id: string) =>
      db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [id]);
    const claimStatus = async (id: string) =>
      (await db.pool.query('SELECT status FROM processed_events WHERE event_key = $1', [id])).rows.map(
        (row: { status: string }) => row.status,
      );
    const totals = async () => ({
      orders: await db.count('SELECT count(*) FROM orders'),
      claims: await db.count('SELECT count(*) FROM processed_events'),
    });
    const scopeTotals = (scope: string) => ({ claimed: 0, replayed: 0, ...metrics.snapshot().claims[scope] });

    it('runs an event emitted twice in sequence once: the second is handled, and replayed', async () => {
      const id = `evt_emit_twice_${transport}`;
      const before = scopeTotals(SCOPES.event);

      await emit({ id, amount: 7 });
      // The outcome is counted right after the commit: once it is there, the order is visible.
      await waitUntil(() => outcomesOf(id).length === 1, `the outcome of the first emit of ${id}`);
      expect(outcomesOf(id)).toEqual(['claimed']);
      expect(await orders(id)).toBe(1);

      await emit({ id, amount: 7 });
      // An event has no answer: the outcome is what proves the second one arrived and was replayed,
      // rather than lost or still pending.
      await waitUntil(() => outcomesOf(id).length === 2, `the outcome of the second emit of ${id}`);
      expect(outcomesOf(id)).toEqual(['claimed', 'replayed']);
      expect(scopeTotals(SCOPES.event)).toMatchObject({
        claimed: before.claimed + 1,
        replayed: before.replayed + 1,
      });
      expect(fixture.callsFor('event', id)).toBe(1);
      const { rows } = await db.pool.query('SELECT amount FROM orders WHERE event_id = $1', [id]);
      expect(rows).toEqual([{ amount: 7 }]);
      expect(await claimStatus(id)).toEqual(['done']);
    });

    it("answers a message's first send with the handler's value and a duplicate with the stored reply, without running it", async () => {
      const id = `evt_send_twice_${transport}`;

      expect(await send(order, { id, amount: 3 })).toEqual({ values: [{ processed: id, amount: 3 }] });
      expect(await send(order, { id, amount: 3 })).toEqual(replayedReply({ processed: id, amount: 3 }));
      expect(await lastValueFrom(running.client.send(order, { id, amount: 3 }))).toEqual({
        processed: id,
        amount: 3,
      });
      expect(await send(order, { id, amount: 3 })).toEqual(replayedReply({ processed: id, amount: 3 }));
      // The reply is stored with the claim, by its COMMIT.
      const { rows } = await db.pool.query('SELECT response FROM processed_events WHERE event_key = $1', [
        id,
      ]);
      expect(rows).toEqual([{ response: { json: JSON.stringify({ processed: id, amount: 3 }) } }]);

      expect(fixture.callsFor('message', id)).toBe(1);
      expect(outcomesOf(id)).toEqual(['claimed', 'replayed', 'replayed', 'replayed']);
      expect(await orders(id)).toBe(1);
      expect(await claims(id)).toBe(1);
    });

    it("replays a message's reply with its keys in the order first sent (jsonb would sort them)", async () => {
      const id = `evt_reply_order_${transport}`;
      // Keys jsonb would reorder: a short one after a long one, integer-like ones, nested, UTF-8.
      const reply = { zeta: { longerKey: [{ yy: 1, x: 2 }], a: null }, 10: 'ten', 2: 'two', é: 'é', e: '😀' };
      const first = await send(order, { id, reply });
      const replay = await send(order, { id, reply });
      expect(replay).toEqual(first);
      const [firstValue] = (first as { values: unknown[] }).values;
      const [replayValue] = (replay as { values: unknown[] }).values;
      expect(JSON.stringify(replayValue)).toBe(JSON.stringify(firstValue));
      expect(JSON.stringify(firstValue)).toBe(JSON.stringify({ processed: id, amount: 1, reply }));
      expect(fixture.callsFor('message', id)).toBe(1);
      expect(outcomesOf(id)).toEqual(['claimed', 'replayed']);
    });

    it('gives 20 concurrent duplicates exactly one effect: one value, the rest replayed (the same value) or in flight', async () => {
      const id = `evt_storm_${transport}`;
      const answers = await Promise.all(Array.from({ length: 20 }, () => send(order, { id })));

      const kinds = answers.map((answer) => {
        if ('values' in answer) {
          // The first delivery's value, or its replay: the same stored reply.
          expect(answer.values).toEqual([{ processed: id, amount: 1 }]);
          return 'value';
        }
        const error = answer.error as { code?: string; retryAfterSeconds?: number };
        // Anything else (IDEMPOTENCY_UNAVAILABLE above all) fails here, naming what came back.
        expect(error).toEqual(
          rpcError(
            'IDEMPOTENCY_IN_FLIGHT',
            SCOPES.message,
            id,
            `Event ${id} is being processed by another delivery; retry later`,
            RETRY_AFTER_SECONDS,
          ).error,
        );
        return 'in_flight';
      });
      const count = (kind: string) => kinds.filter((each) => each === kind).length;
      expect(count('value') + count('in_flight')).toBe(20);
      // Every answer is the library's own outcome for that delivery, counted once.
      expect(outcomesOf(id).filter((outcome) => outcome === 'claimed')).toHaveLength(1);
      expect(outcomesOf(id).filter((outcome) => outcome === 'replayed')).toHaveLength(count('value') - 1);
      expect(outcomesOf(id).filter((outcome) => outcome === 'in_flight')).toHaveLength(count('in_flight'));
      expect(outcomesOf(id)).toHaveLength(20);

      expect(fixture.callsFor('message', id)).toBe(1);
      expect(await orders(id)).toBe(1);
      expect(await claims(id)).toBe(1);
    });

    it('answers a duplicate of a parked transaction-mode message IDEMPOTENCY_IN_FLIGHT, then replays it', async () => {
      const id = `evt_parked_tx_${transport}`;
      const gates = running.app.get(Gates);
      const parked = send(order, { id, block: true }, PARKED_DEADLINE_MS);
      await gates.entered(id);

      // It waits DUPLICATE_WAIT_MS for the parked transaction, which neither commits nor rolls back.
      const duplicate = await send(order, { id });
      expect(duplicate).toEqual(
        rpcError(
          'IDEMPOTENCY_IN_FLIGHT',
          SCOPES.message,
          id,
          `Event ${id} is being processed by another delivery; retry later`,
          RETRY_AFTER_SECONDS,
        ),
      );
      const { retryAfterSeconds } = (duplicate as { error: { retryAfterSeconds: number } }).error;
      expect(Number.isInteger(retryAfterSeconds) && retryAfterSeconds > 0).toBe(true);
      // Nothing of the duplicate: the handler ran once (parked), and its writes are uncommitted.
      expect(fixture.callsFor('message', id)).toBe(1);
      expect(await orders(id)).toBe(0);
      expect(await claims(id)).toBe(0);

      gates.open(id);
      expect(await parked).toEqual({ values: [{ processed: id, amount: 1 }] });
      expect(await send(order, { id })).toEqual(replayedReply({ processed: id, amount: 1 }));
      expect(fixture.callsFor('message', id)).toBe(1);
      expect(outcomesOf(id)).toEqual(['in_flight', 'claimed', 'replayed']);
      expect(await orders(id)).toBe(1);
      expect(await claimStatus(id)).toEqual(['done']);
    });

    it('answers a duplicate of a parked external-mode message IDEMPOTENCY_IN_FLIGHT from the lease, then replays it', async () => {
      const id = `evt_parked_lease_${transport}`;
      const gates = running.app.get(Gates);
      const downstream = () => db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [id]);
      const parked = send(external, { id, block: true }, PARKED_DEADLINE_MS);
      await gates.entered(id);

      const duplicate = await send(external, { id });
      expect(duplicate).toMatchObject({
        error: {
          status: 'error',
          code: 'IDEMPOTENCY_IN_FLIGHT',
          scope: SCOPES.external,
          key: id,
          message: `Event ${id} is being processed by another delivery; retry later`,
        },
      });
      // From the live lease (5 minutes by default), capped at the module's retryAfterSeconds.
      const { retryAfterSeconds } = (duplicate as { error: { retryAfterSeconds: number } }).error;
      expect(Number.isInteger(retryAfterSeconds)).toBe(true);
      expect(retryAfterSeconds).toBeGreaterThan(0);
      expect(retryAfterSeconds).toBeLessThanOrEqual(RETRY_AFTER_SECONDS);
      // Nothing of the duplicate: only the parked holder's lease, and no downstream call yet.
      expect(fixture.callsFor('external', id)).toBe(1);
      expect(await downstream()).toBe(0);
      expect(await db.count('SELECT attempts FROM processed_events WHERE event_key = $1', [id])).toBe(1);
      expect(await claimStatus(id)).toEqual(['in_progress']);

      gates.open(id);
      expect(await parked).toEqual({ values: [{ captured: id, attempt: 1 }] });
      expect(await claimStatus(id)).toEqual(['done']);
      // The fenced completion stored the reply.
      expect(await send(external, { id })).toEqual(replayedReply({ captured: id, attempt: 1 }));
      expect(fixture.callsFor('external', id)).toBe(1);
      expect(outcomesOf(id)).toEqual(['claimed', 'in_flight', 'replayed']);
      expect(await downstream()).toBe(1);
    });

    it('refuses a bad key with IDEMPOTENCY_INVALID_KEY naming the problem, writing nothing', async () => {
      const before = await totals();
      const calls = fixture.calls.message.length;
      const key = (problem: string) => `Idempotency key of ${SCOPES.message} ${problem}`;

      expect(await send(order, { amount: 1 })).toEqual(
        rpcError(
          'IDEMPOTENCY_INVALID_KEY',
          SCOPES.message,
          undefined,
          key('must be a string, got undefined'),
        ),
      );
      expect(await send(order, { id: '' })).toEqual(
        rpcError('IDEMPOTENCY_INVALID_KEY', SCOPES.message, undefined, key('is empty')),
      );
      expect(await send(order, { id: 'k'.repeat(256) })).toEqual(
        rpcError(
          'IDEMPOTENCY_INVALID_KEY',
          SCOPES.message,
          undefined,
          key('is 256 characters long; the maximum is 255'),
        ),
      );

      expect(fixture.calls.message).toHaveLength(calls);
      expect(await totals()).toEqual(before);
    });

    it('logs and acknowledges an emitted event with a bad key, writing nothing', async () => {
      const before = await totals();
      const calls = fixture.calls.event.length;
      logger.clear();

      await emit({ amount: 1 });
      // The event has no caller to tell, and failing it would make a broker (Kafka) redeliver it
      // forever: the library logs it and acknowledges it.
      const [line] = await logger.waitFor('error', [
        `Idempotency key of ${SCOPES.event} must be a string, got undefined`,
        'the event was acknowledged without running its handler',
      ]);
      expect(line.context).toBe('IdempotencyModule');
      expect(logger.find('error', 'IDEMPOTENCY_INVALID_KEY')).toEqual([]);

      expect(fixture.calls.event).toHaveLength(calls);
      expect(await totals()).toEqual(before);
    });

    it('rolls the claim back when a message handler throws; the redelivery runs it once', async () => {
      const id = `evt_throws_${transport}`;
      fixture.failOnce.add(id);

      // A handler's own error is not the library's: Nest answers its generic RPC error.
      expect(await send(order, { id })).toEqual({
        error: { status: 'error', message: 'Internal server error' },
      });
      expect(fixture.callsFor('message', id)).toBe(1);
      expect(outcomesOf(id)).toEqual(['failed']);
      expect(await orders(id)).toBe(0);
      // Rolled back; only the failure's record, outside the transaction, for the poison report.
      expect(await claimStatus(id)).toEqual(['failed']);

      // The same payload again, as a sender that retries sends it.
      expect(await send(order, { id })).toEqual({ values: [{ processed: id, amount: 1 }] });
      expect(await send(order, { id })).toEqual(replayedReply({ processed: id, amount: 1 }));
      expect(fixture.callsFor('message', id)).toBe(2);
      expect(outcomesOf(id)).toEqual(['failed', 'reclaimed', 'replayed']);
      expect(await orders(id)).toBe(1);
      expect(await claimStatus(id)).toEqual(['done']);
    });

    it('rolls the claim back when an event handler throws; the re-emitted event runs it once', async () => {
      const id = `evt_event_throws_${transport}`;
      fixture.failOnce.add(id);

      await emit({ id });
      await waitUntil(() => outcomesOf(id).length === 1, `the outcome of the failing emit of ${id}`);
      expect(outcomesOf(id)).toEqual(['failed']);
      expect(await orders(id)).toBe(0);
      // Rolled back; only the failure's record, outside the transaction, for the poison report.
      expect(await claimStatus(id)).toEqual(['failed']);

      // TCP and Redis never redeliver an event: the test plays the sender that does.
      await emit({ id });
      await waitUntil(() => outcomesOf(id).length === 2, `the outcome of the re-emitted ${id}`);
      expect(outcomesOf(id)).toEqual(['failed', 'reclaimed']);
      expect(fixture.callsFor('event', id)).toBe(2);
      expect(await orders(id)).toBe(1);
      expect(await claimStatus(id)).toEqual(['done']);
    });
  });

  describe('SIGKILL between claim and commit', () => {
    let db: TestDatabase;
    const children: ChildMicroservice[] = [];

    const start = async () => {
      const child = await startChildMicroservice(transport, { databaseUrl: db.url });
      children.push(child);
      return child;
    };

    beforeAll(async () => {
      db = await createTestDatabase();
    });

    afterEach(async () => {
      await Promise.all(children.splice(0).map((child) => child.stop()));
    });

    afterAll(async () => {
      await db?.drop();
    });

    it('rolls the claim back with the process; the redelivery to a second process has the one effect', async () => {
      const id = `evt_sigkill_${transport}`;
      const orders = () => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
      const claims = () => db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [id]);

      const doomed = await start();
      // The child's process dies under it: the caller gets no answer, only its client's
      // "Connection closed" once the kill has closed it.
      const lost = observe(doomed.client.send(order, { id, block: true }), PARKED_DEADLINE_MS);
      await doomed.entered(id);
      await doomed.kill();
      expect(await lost).toMatchObject({ error: { message: 'Connection closed' } });

      // Postgres ends the dead client's backend and rolls back its claim and its order.
      await waitUntil(
        async () => (await openTransactions(db)) === 0,
        'the transaction of the killed microservice to end',
      );
      expect(await orders()).toBe(0);
      expect(await claims()).toBe(0);

      // The test is the sender: it delivers the same message again, to a second process.
      const survivor = await start();
      expect(await observe(survivor.client.send(order, { id, block: false }))).toEqual({
        values: [{ processed: id, amount: 1 }],
      });
      expect(await observe(survivor.client.send(order, { id }))).toEqual(
        replayedReply({ processed: id, amount: 1 }),
      );
      expect(await orders()).toBe(1);
      expect(await claims()).toBe(1);
      expect(
        await db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [
          id,
        ]),
      ).toBe(1);
    });
  });

  describe('database outage', () => {
    let server: PostgresServer;
    let db: TestDatabase;
    let running: RunningMicroservice;
    let fixture: MicroserviceFixtureController;
    const logger = new LogCapture();

    beforeAll(async () => {
      // A server of its own, since this test stops it.
      server = await startPostgres({ reuseDatabaseUrl: false });
      db = await createTestDatabase(server.adminUrl);
      running = await startMicroservice(transport, { databaseUrl: db.url }, logger);
      fixture = running.app.get(MicroserviceFixtureController);
    }, 120_000);

    afterAll(async () => {
      await running?.close();
      // The database went with its server: only the test's pool is left to close.
      await db?.pool.end();
      await server?.stop();
    });

    const send = (pattern: string, data: object) => observe(running.client.send(pattern, data));

    it('answers IDEMPOTENCY_UNAVAILABLE with retryAfterSeconds in both modes, never a value, calling no handler', async () => {
      const done = `evt_before_outage_${transport}`;
      const during = `evt_during_outage_${transport}`;
      expect(await send(order, { id: done })).toEqual({ values: [{ processed: done, amount: 1 }] });
      expect(await send(external, { id: done })).toEqual({ values: [{ captured: done, attempt: 1 }] });
      const calls = structuredClone(fixture.calls);

      await server.stop();

      const cases = [
        { pattern: order, scope: SCOPES.message },
        { pattern: external, scope: SCOPES.external },
      ];
      for (const { pattern, scope } of cases) {
        // A new message, and one done before the outage: "done" cannot be checked either.
        for (const id of [during, done]) {
          expect(await send(pattern, { id })).toEqual(
            rpcError(
              'IDEMPOTENCY_UNAVAILABLE',
              scope,
              id,
              `Could not record event ${id}: the database is unavailable; retry later`,
              RETRY_AFTER_SECONDS,
            ),
          );
        }
      }

      // An event has no caller: the unavailable claim is logged, and its handler not run either.
      // The library's own line: Nest 12 also logs the RpcException of a failed event, Nest 11 does not.
      await lastValueFrom(running.client.emit(orderEvent, { id: during }).pipe(timeout(10_000)), {
        defaultValue: undefined,
      });
      await logger.waitFor('error', [`Claim of ${SCOPES.event} key ${during} failed`]);
      expect(fixture.calls).toEqual(calls);
    });
  });
});

/**
 * Redis pub/sub hands every message to every server subscribed to its channel: two replicas of
 * one microservice both receive each event and each request. That is a duplicate on every
 * delivery, and the claim is what keeps it to one effect.
 */
describe('Redis fan-out to two replicas', () => {
  let db: TestDatabase;
  const replicas: RunningMicroservice[] = [];
  const outcomes: ClaimOutcomeEvent[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
    // One at a time: each start waits for the subscriber count to move by one.
    for (let replica = 0; replica < 2; replica++) {
      replicas.push(
        await startMicroservice('redis', {
          databaseUrl: db.url,
          // Far above a claim's latency: the replica that loses the race must see the other's
          // commit, not the end of its wait.
          idempotency: { concurrentDuplicateWaitMs: 30_000, onOutcome: (event) => outcomes.push(event) },
        }),
      );
    }
  });

  afterAll(async () => {
    for (const replica of replicas.splice(0).reverse()) await replica.close();
    await db?.drop();
  });

  const outcomesOf = (id: string) =>
    outcomes
      .filter((event) => event.key === id)
      .map((event) => event.outcome)
      .sort();
  const calls = (handler: 'event' | 'message', id: string) =>
    replicas
      .map((replica) => replica.app.get(MicroserviceFixtureController).callsFor(handler, id))
      .reduce((sum, each) => sum + each, 0);
  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);

  it('runs an event both replicas receive once', async () => {
    const id = 'evt_fan_out_event';
    await lastValueFrom(replicas[0].client.emit(orderEvent, { id }).pipe(timeout(10_000)), {
      defaultValue: undefined,
    });
    await waitUntil(() => outcomesOf(id).length === 2, `both replicas' outcomes of ${id}`);
    // The second replica waits on the first one's claim, then sees it committed.
    expect(outcomesOf(id)).toEqual(['claimed', 'replayed']);
    expect(calls('event', id)).toBe(1);
    expect(await orders(id)).toBe(1);
  });

  it('runs a request both replicas receive once; the caller gets whichever reply comes first', async () => {
    const id = 'evt_fan_out_request';
    const answer = await observe(replicas[0].client.send(order, { id }));
    await waitUntil(() => outcomesOf(id).length === 2, `both replicas' outcomes of ${id}`);
    expect(outcomesOf(id)).toEqual(['claimed', 'replayed']);
    // Both replicas reply; the client keeps the first and drops the other. Either is the same
    // value: the replica that replays answers the reply the other stored.
    expect(answer).toEqual({ values: [{ processed: id, amount: 1 }] });
    expect(calls('message', id)).toBe(1);
    expect(await orders(id)).toBe(1);
  });
});
