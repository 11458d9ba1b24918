import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { LogCapture } from '../support/log-capture.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { startPostgres, type PostgresServer } from '../support/postgres-server.js';
import { CountingController } from '../fixtures/outage.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';

/** A delivery that hangs instead of failing fast is a failure of this test, not a Jest timeout. */
const ANSWER_DEADLINE_MS = 15_000;

/**
 * Database stopped: every delivery is answered 503 with Retry-After, never 200 (not even for an
 * event processed before the outage: "done" cannot be checked), and no handler runs unclaimed.
 */
describe.each(onAdapter('fastify'))('database outage (%s)', (adapter) => {
  let server: PostgresServer;
  let db: TestDatabase;
  let running: RunningApp;
  const logger = new LogCapture();

  beforeAll(async () => {
    // A server of its own, since this test stops it.
    server = await startPostgres({ reuseDatabaseUrl: false });
    db = await createTestDatabase(server.adminUrl);
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({ databaseUrl: db.url, controllers: [CountingController] }),
    ]);
    running.app.useLogger(logger);
  }, 120_000);

  afterAll(async () => {
    await running?.close();
    // The database went with its server: only the test's pool is left to close.
    await db?.pool.end();
    await server?.stop();
  });

  const deliver = (path: string, id: string, block?: boolean) =>
    request(running.url).post(path).send({ id, block }).timeout(ANSWER_DEADLINE_MS);

  it('answers 503 + Retry-After, never 200, from a parked commit and in both modes, calling no handler', async () => {
    const calls = running.app.get(CountingController).calls;
    expect((await deliver('/orders', 'evt_before')).status).toBe(200);
    expect((await deliver('/external', 'evt_before')).status).toBe(200);
    expect(await db.count('SELECT count(*) FROM orders')).toBe(1);
    expect(await db.count('SELECT count(*) FROM downstream_calls')).toBe(1);
    expect(calls).toEqual({ transaction: 1, external: 1 });

    // A handler parked inside its transaction when the database goes: its commit cannot happen,
    // so the answer is 503 (the sender retries), not the handler's 200.
    const gates = running.app.get(Gates);
    const parked = deliver('/orders', 'evt_parked', true).then((answer) => answer);
    await gates.entered('evt_parked');
    await server.stop();
    gates.open('evt_parked');
    const cut = await parked;
    expect(cut.status).toBe(503);
    expect(cut.headers['retry-after']).toBe('30');
    expect(calls).toEqual({ transaction: 2, external: 1 });

    for (const path of ['/orders', '/external']) {
      // A new event, and one that was done before the outage: neither may be answered 200.
      for (const id of ['evt_during', 'evt_before']) {
        const answer = await deliver(path, id);
        expect({ path, id, status: answer.status }).toEqual({ path, id, status: 503 });
        expect(answer.headers['retry-after']).toBe('30');
        expect(answer.body.message).toBe(
          `Could not record event ${id}: the database is unavailable; retry later`,
        );
      }
    }
    expect(calls).toEqual({ transaction: 2, external: 1 });

    // The parked COMMIT was sent with the connection gone: it may or may not have committed, and
    // the log says so rather than calling it a failed claim. (It fails after TypeORM has released
    // the broken connection, which leaves no code: 'none'.)
    const ambiguous = logger.find('error', 'COMMIT of ').map((line) => line.message);
    expect(ambiguous).toHaveLength(1);
    expect(ambiguous[0]).toMatch(
      /^COMMIT of CountingController\.order key evt_parked may have committed; the redelivery will tell \(SQLSTATE \w+\): /,
    );
    // Each failed claim is logged with its scope, key and the error's code: a SQLSTATE, or the
    // socket error's code when no server answers.
    const failures = logger.find('error', 'Claim of ').map((line) => line.message);
    expect(failures).toHaveLength(4);
    for (const message of failures) {
      expect(message).toMatch(
        /^Claim of CountingController\.\w+ key evt_\w+ failed \(SQLSTATE ECONNREFUSED\): /,
      );
    }
  });
});
