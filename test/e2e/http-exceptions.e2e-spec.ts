import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { duplicateInFlight } from '../../lib/idempotency.messages.js';
import {
  DefaultAnswersController,
  FilteredController,
  type FilterReport,
} from '../fixtures/http-exceptions.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { startPostgres, type PostgresServer } from '../support/postgres-server.js';
import { databaseUnavailable } from '../../lib/strategies/database-unavailable.js';
import { keyNotString } from '../../lib/core/idempotency-key.js';

/** A delivery that hangs instead of failing fast is a failure of this test, not a Jest timeout. */
const ANSWER_DEADLINE_MS = 15_000;
/** The module's default retryAfterSeconds, sent as Retry-After. */
const RETRY_AFTER = 30;

/** The two modes, by route and the scope their claims are stored under. */
const MODES = [
  { mode: 'transaction', route: 'orders', method: 'order' },
  { mode: 'external', route: 'external', method: 'external' },
] as const;

/**
 * The error classes of the errors entry, each an HttpException: a user's `@Catch(...)` filter
 * sees each one by `instanceof`, with `retryAfterSeconds` where a retry is asked for; without a
 * filter the answers stay 400 / 409 + Retry-After / 503 + Retry-After.
 */
describe.each(ADAPTERS)('the errors as HTTP exceptions (%s)', (adapter) => {
  let server: PostgresServer;
  let db: TestDatabase;
  let running: RunningApp;
  let gates: Gates;
  let filtered: FilteredController;
  let unfiltered: DefaultAnswersController;

  beforeAll(async () => {
    // A server of its own: the last test stops it.
    server = await startPostgres({ reuseDatabaseUrl: false });
    db = await createTestDatabase(server.adminUrl);
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers: [FilteredController, DefaultAnswersController],
        // A duplicate of a parked delivery is answered at once, not after 5 s.
        idempotency: { concurrentDuplicateWaitMs: 0 },
      }),
    ]);
    gates = running.app.get(Gates);
    filtered = running.app.get(FilteredController);
    unfiltered = running.app.get(DefaultAnswersController);
  }, 120_000);

  afterAll(async () => {
    gates?.openAll();
    await running?.close();
    // The database went with its server: only the test's pool is left to close.
    await db?.pool.end();
    await server?.stop();
  });

  const deliver = (path: string, body: object) =>
    request(running.url).post(path).send(body).timeout(ANSWER_DEADLINE_MS);
  const claims = (scope: string) =>
    db.count('SELECT count(*) FROM processed_events WHERE scope = $1', [scope]);

  it('the filter sees InvalidIdempotencyKeyError (400) nothing is written', async () => {
    for (const { route, method } of MODES) {
      const scope = `FilteredController.${method}`;
      for (const body of [{ id: 42 }, {}]) {
        const answer = await deliver(`/filtered/${route}`, body);
        const key = (body as { id?: unknown }).id;
        expect(answer.status).toBe(400);
        expect(answer.headers['retry-after']).toBeUndefined();
        expect(answer.body).toEqual({
          filter: 'IdempotencyExceptionFilter',
          exception: 'InvalidIdempotencyKeyError',
          isHttpException: true,
          status: 400,
          retryAfterSeconds: null,
          error: {
            class: 'InvalidIdempotencyKeyError',
            code: 'IDEMPOTENCY_INVALID_KEY',
            scope,
            key: null,
            message: keyNotString(scope, key),
            retryAfterSeconds: null,
            sqlState: null,
            causeCode: null,
          },
        } satisfies FilterReport);
      }
      expect(await claims(scope)).toBe(0);
    }
    expect(filtered.calls).toEqual({ transaction: 0, external: 0 });
    expect(await db.count('SELECT count(*) FROM orders')).toBe(0);
  });

  it('without a filter a bad key is still a plain 400', async () => {
    for (const { route, method } of MODES) {
      const scope = `DefaultAnswersController.${method}`;
      const answer = await deliver(`/default/${route}`, { id: 42 });
      expect(answer.status).toBe(400);
      expect(answer.headers['retry-after']).toBeUndefined();
      expect(answer.body).toEqual({
        statusCode: 400,
        error: 'Bad Request',
        message: keyNotString(scope, 42),
      });
      expect(await claims(scope)).toBe(0);
    }
    expect(unfiltered.calls).toEqual({ transaction: 0, external: 0 });
  });

  it('the filter sees EventInFlightError (409 + Retry-After) for a duplicate of a parked delivery', async () => {
    for (const { mode, route, method } of MODES) {
      const scope = `FilteredController.${method}`;
      const id = `evt_filtered_${mode}`;
      const parked = deliver(`/filtered/${route}`, { id, block: true }).then((answer) => answer);
      await gates.entered(id);

      const duplicate = await deliver(`/filtered/${route}`, { id });
      expect(duplicate.status).toBe(409);
      // Set by the interceptor before the filter ran, and kept by the filter's own answer.
      expect(duplicate.headers['retry-after']).toBe(String(RETRY_AFTER));
      expect(duplicate.body).toEqual({
        filter: 'IdempotencyExceptionFilter',
        exception: 'EventInFlightError',
        isHttpException: true,
        status: 409,
        retryAfterSeconds: RETRY_AFTER,
        error: {
          class: 'EventInFlightError',
          code: 'IDEMPOTENCY_IN_FLIGHT',
          scope,
          key: id,
          message: duplicateInFlight(id),
          retryAfterSeconds: RETRY_AFTER,
          sqlState: null,
          causeCode: null,
        },
      } satisfies FilterReport);

      gates.open(id);
      const first = await parked;
      expect(first.status).toBe(200);
      expect(first.body).toEqual({ processed: id });
    }
    // Each event ran once: the duplicates ran nothing.
    expect(filtered.calls).toEqual({ transaction: 1, external: 1 });
    expect(
      await db.count('SELECT count(*) FROM orders WHERE event_id = $1', ['evt_filtered_transaction']),
    ).toBe(1);
    expect(
      await db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', ['evt_filtered_external']),
    ).toBe(1);
  });

  it('without a filter a duplicate in flight is still 409 + Retry-After', async () => {
    for (const { mode, route } of MODES) {
      const id = `evt_default_${mode}`;
      const parked = deliver(`/default/${route}`, { id, block: true }).then((answer) => answer);
      await gates.entered(id);
      const duplicate = await deliver(`/default/${route}`, { id });
      expect(duplicate.status).toBe(409);
      expect(duplicate.headers['retry-after']).toBe(String(RETRY_AFTER));
      expect(duplicate.body).toEqual({ statusCode: 409, message: duplicateInFlight(id) });
      gates.open(id);
      expect((await parked).status).toBe(200);
    }
    expect(unfiltered.calls).toEqual({ transaction: 1, external: 1 });
  });

  it("leaves the handler's own errors to Nest: the filter does not catch them", async () => {
    const answer = await deliver('/filtered/orders', { id: 'evt_fails', fail: true });
    expect(answer.status).toBe(500);
    expect(answer.body).toEqual({ statusCode: 500, message: 'Internal server error' });
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', ['evt_fails'])).toBe(0);
    expect(filtered.calls.transaction).toBe(2);
  });

  it('with the database stopped: the filter sees IdempotencyUnavailableError (503 + Retry-After); by default a plain 503', async () => {
    const before = { filtered: { ...filtered.calls }, unfiltered: { ...unfiltered.calls } };
    await server.stop();

    for (const { mode, route, method } of MODES) {
      const scope = `FilteredController.${method}`;
      const id = `evt_down_${mode}`;
      const answer = await deliver(`/filtered/${route}`, { id });
      expect(answer.status).toBe(503);
      expect(answer.headers['retry-after']).toBe(String(RETRY_AFTER));
      expect(answer.body).toEqual({
        filter: 'IdempotencyExceptionFilter',
        exception: 'IdempotencyUnavailableError',
        isHttpException: true,
        status: 503,
        retryAfterSeconds: RETRY_AFTER,
        error: {
          class: 'IdempotencyUnavailableError',
          code: 'IDEMPOTENCY_UNAVAILABLE',
          scope,
          key: id,
          message: databaseUnavailable(id),
          retryAfterSeconds: RETRY_AFTER,
          // No server answers: the socket's error, kept as the neutral error's own cause.
          sqlState: 'ECONNREFUSED',
          causeCode: 'ECONNREFUSED',
        },
      } satisfies FilterReport);

      const plain = await deliver(`/default/${route}`, { id });
      expect(plain.status).toBe(503);
      expect(plain.headers['retry-after']).toBe(String(RETRY_AFTER));
      expect(plain.body).toEqual({
        statusCode: 503,
        error: 'Service Unavailable',
        message: databaseUnavailable(id),
      });
    }
    // No handler ran unclaimed.
    expect(filtered.calls).toEqual(before.filtered);
    expect(unfiltered.calls).toEqual(before.unfiltered);
  });
});
