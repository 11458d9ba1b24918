import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Type } from '@nestjs/common';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import {
  ExternalModeTransactionController,
  ExternalTransactionController,
  HANDLER_HEADER,
  NextOwnedController,
  PassthroughController,
  ResponseNotPassedThroughController,
  ResponseOwnedController,
  UnprotectedResponseController,
} from '../fixtures/handler-arguments.fixture.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type AdapterName, type RunningApp } from '../support/app.js';
import { bootFailure } from '../support/boot-failure.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/** What the boot failure says of a handler that sends its own answer. */
const OWNS_RESPONSE = 'takes @Res() or @Next() and sends its own answer';
/** What it says of `@WebhookTransaction()` on an external-mode handler. */
const TRANSACTION_IN_EXTERNAL = 'runs in external mode and takes @WebhookTransaction()';

/**
 * A protected handler's parameters are checked at boot: one that takes `@Res()` or `@Next()`
 * without passthrough would answer before the claim's COMMIT (a failed COMMIT loses the event
 * after its 200), twice on a retried transaction, and never on a replay; `@WebhookTransaction()`
 * in external mode would hand out a manager whose writes commit with nothing. Both fail the boot
 * naming Class.method. `@Res({ passthrough: true })` boots, and the library keeps the answer.
 */
describe.each(ADAPTERS)('protected handlers and their arguments (%s)', (adapter) => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterAll(async () => {
    await db?.drop();
  });

  /** An app of `controllers` on `adapter`, not yet initialised. */
  async function createApp(name: AdapterName, controllers: Type[]) {
    const moduleRef = await Test.createTestingModule({
      imports: [WebhookFixtureModule.forDatabase({ databaseUrl: db.url, controllers })],
    }).compile();
    return name === 'fastify'
      ? moduleRef.createNestApplication(new FastifyAdapter(), { logger: false })
      : moduleRef.createNestApplication({ logger: false });
  }

  it.each<[string, Type, string, string]>([
    ['@Res()', ResponseOwnedController, 'ResponseOwnedController.answerItself', OWNS_RESPONSE],
    [
      '@Res({ passthrough: false })',
      ResponseNotPassedThroughController,
      'ResponseNotPassedThroughController.answerItself',
      OWNS_RESPONSE,
    ],
    ['@Next()', NextOwnedController, 'NextOwnedController.handOn', OWNS_RESPONSE],
    [
      '@WebhookTransaction() with external: true',
      ExternalTransactionController,
      'ExternalTransactionController.capture',
      TRANSACTION_IN_EXTERNAL,
    ],
    [
      "@WebhookTransaction() with mode: 'external' on a @MessagePattern",
      ExternalModeTransactionController,
      'ExternalModeTransactionController.capture',
      TRANSACTION_IN_EXTERNAL,
    ],
  ])('fails the boot for a handler taking %s, naming it', async (_, controller, where, says) => {
    const failure = await bootFailure(await createApp(adapter, [controller]));
    expect(failure.message).toContain(`${where} ${says}`);
    // Nothing was claimed on the way: the boot stopped before any delivery.
    expect(await db.count('SELECT count(*) FROM processed_events')).toBe(0);
  });

  it('names every refused handler of an app in one boot failure', async () => {
    const failure = await bootFailure(
      await createApp(adapter, [
        PassthroughController,
        ResponseOwnedController,
        NextOwnedController,
        ExternalTransactionController,
      ]),
    );
    expect(failure.message).toContain(`ResponseOwnedController.answerItself ${OWNS_RESPONSE}`);
    expect(failure.message).toContain(`NextOwnedController.handOn ${OWNS_RESPONSE}`);
    expect(failure.message).toContain(`ExternalTransactionController.capture ${TRANSACTION_IN_EXTERNAL}`);
    // The passthrough handler is not among them.
    expect(failure.message).not.toContain('PassthroughController');
  });

  describe('with @Res({ passthrough: true })', () => {
    let running: RunningApp;

    beforeAll(async () => {
      running = await startApp(adapter, [
        WebhookFixtureModule.forDatabase({
          databaseUrl: db.url,
          // A route without @IdempotentWebhook may answer through @Res() as it likes.
          controllers: [PassthroughController, UnprotectedResponseController],
        }),
      ]);
    });

    afterAll(async () => {
      await running?.close();
    });

    it("boots; sends the handler's header with its answer, and replays without calling it", async () => {
      const id = `evt_passthrough_${adapter}`;
      const processed = await request(running.url).post('/arguments/passthrough').send({ id });
      expect(processed.status).toBe(200);
      expect(processed.body).toEqual({ processed: id });
      expect(processed.headers[HANDLER_HEADER]).toBe(id);
      expect(processed.headers['idempotent-replayed']).toBeUndefined();

      const replay = await request(running.url).post('/arguments/passthrough').send({ id });
      expect(replay.status).toBe(200);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      // The handler did not run: no header of its own, no second order.
      expect(replay.headers[HANDLER_HEADER]).toBeUndefined();
      expect(running.app.get(PassthroughController).runs.get(id)).toBe(1);
      expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(1);
      expect(
        await db.count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [
          id,
        ]),
      ).toBe(1);
    });

    it('leaves a route it does not protect free to answer through @Res()', async () => {
      const answer = await request(running.url).post('/arguments/unprotected').send({ id: 'evt_plain' });
      expect([answer.status, answer.body]).toEqual([200, { unprotected: 'evt_plain' }]);
      expect(
        await db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', ['evt_plain']),
      ).toBe(0);
    });
  });
});
