import 'reflect-metadata';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  GUARDS_METADATA,
  HEADERS_METADATA,
  HTTP_CODE_METADATA,
  INTERCEPTORS_METADATA,
  ROUTE_ARGS_METADATA,
} from '@nestjs/common/constants.js';
import request from 'supertest';
import { IdempotencyContext, IdempotencyInterceptor, IdempotentWebhook } from '../../lib/index.js';
import { IDEMPOTENT_WEBHOOK_METADATA } from '../../lib/idempotency.constants.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { LogCapture } from '../support/log-capture.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import {
  calls,
  ROLE_METADATA,
  RoleGuard,
  STACKED_HEADER,
  StackedController,
  UndecoratedController,
} from '../fixtures/decorators.fixture.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';

const OUTSIDE_CONTEXT =
  'IdempotencyContext used outside an idempotent handler (@IdempotentWebhook, @Idempotent or IdempotencyService.run)';
const OUTSIDE_TRANSACTION = '@WebhookTransaction() is only available in an @IdempotentWebhook handler';
const HANDLERS = ['wrappedAbove', 'wrappedBelow'] as const;

/** Nest's ExceptionsHandler logs the thrown Error itself; keep its message rather than '{}'. */
class ErrorMessageCapture extends LogCapture {
  override error(message: unknown, ...rest: unknown[]): void {
    super.error(message instanceof Error ? message.message : message, ...rest);
  }
}

describe('@IdempotentWebhook metadata', () => {
  it.each(HANDLERS)('survives the decorators stacked on %s, including a metadata-copying wrapper', (name) => {
    const handler = StackedController.prototype[name];
    expect(Reflect.getMetadata(IDEMPOTENT_WEBHOOK_METADATA, handler)).toMatchObject({
      scope: `StackedController.${name}`,
      source: `StackedController.${name}`,
      mode: 'transaction',
    });
    expect(Reflect.getMetadata(INTERCEPTORS_METADATA, handler)).toContain(IdempotencyInterceptor);
    expect(Reflect.getMetadata(HTTP_CODE_METADATA, handler)).toBe(200);
    expect(Reflect.getMetadata(GUARDS_METADATA, handler)).toContain(RoleGuard);
    expect(Reflect.getMetadata(ROLE_METADATA, handler)).toBe('webhook');
    expect(Reflect.getMetadata(HEADERS_METADATA, handler)).toContainEqual({
      name: STACKED_HEADER,
      value: 'yes',
    });
    expect(handler.name).toBe(name);
  });

  it('throws a TypeError at decoration time without a key function', () => {
    const decorate = (options: unknown) => () => {
      class Late {
        @IdempotentWebhook(options as never)
        handle() {}
      }
      return Late;
    };
    expect(decorate({})).toThrow(TypeError);
    expect(decorate({})).toThrow(
      '@IdempotentWebhook needs a key function, e.g. { key: (event) => event.id }',
    );
    expect(decorate(undefined)).toThrow(TypeError);
    expect(decorate({ key: 'id' })).toThrow(TypeError);
    expect(decorate({ key: () => 'k', leaseMs: 0 })).toThrow(
      '@IdempotentWebhook leaseMs must be a positive number of milliseconds, got 0',
    );
  });

  it('makes IdempotencyContext throw a clear error outside a decorated handler', () => {
    const context = new IdempotencyContext();
    expect(context.active).toBe(false);
    expect(() => context.key).toThrow(OUTSIDE_CONTEXT);
    expect(() => context.manager).toThrow(OUTSIDE_CONTEXT);
    expect(() => context.scope).toThrow(OUTSIDE_CONTEXT);
    expect(() => context.extendLease()).toThrow(OUTSIDE_CONTEXT);
  });

  it('makes @WebhookTransaction() throw a clear error outside a decorated handler', () => {
    const args = Reflect.getMetadata(ROUTE_ARGS_METADATA, UndecoratedController, 'readManager') as Record<
      string,
      { factory: (data: unknown, context: unknown) => unknown }
    >;
    const [parameter] = Object.values(args);
    expect(() => parameter.factory(undefined, undefined)).toThrow(OUTSIDE_TRANSACTION);
  });
});

describe.each(ADAPTERS)('stacked decorators over HTTP (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  const logger = new ErrorMessageCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        controllers: [StackedController, UndecoratedController],
      }),
    ]);
    running.app.useLogger(logger);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const paths = { wrappedAbove: '/stacked/wrapped-above', wrappedBelow: '/stacked/wrapped-below' };

  it.each(HANDLERS)('%s dedupes, answers 200, and runs the guard and the wrapper', async (name) => {
    const id = `evt_${name}_${adapter}`;
    const guardBefore = calls.guard.get(name) ?? 0;
    const wrapperBefore = calls.wrapper.get(name) ?? 0;

    const first = await request(running.url).post(paths[name]).send({ id });
    expect(first.status).toBe(200);
    expect(first.body).toEqual({ processed: id });
    expect(first.headers[STACKED_HEADER.toLowerCase()]).toBe('yes');
    expect(first.headers['idempotent-replayed']).toBeUndefined();

    const second = await request(running.url).post(paths[name]).send({ id });
    expect(second.status).toBe(200);
    expect(second.headers['idempotent-replayed']).toBe('true');

    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(1);
    const { rows } = await db.pool.query('SELECT scope FROM processed_events WHERE event_key = $1', [id]);
    expect(rows).toEqual([{ scope: `StackedController.${name}` }]);
    // The guard runs for both deliveries; the wrapped handler only for the first.
    expect((calls.guard.get(name) ?? 0) - guardBefore).toBe(2);
    expect((calls.wrapper.get(name) ?? 0) - wrapperBefore).toBe(1);
  });

  it('answers 500 when an undecorated route uses IdempotencyContext or @WebhookTransaction()', async () => {
    expect((await request(running.url).post('/undecorated/context').send({ id: 'x' })).status).toBe(500);
    expect((await request(running.url).post('/undecorated/transaction').send({ id: 'x' })).status).toBe(500);
    const logged = logger.find('error').map((line) => line.message);
    expect(logged).toContain(OUTSIDE_CONTEXT);
    expect(logged).toContain(OUTSIDE_TRANSACTION);
    expect(await db.count(`SELECT count(*) FROM processed_events WHERE scope LIKE 'Undecorated%'`)).toBe(0);

    const active = await request(running.url).post('/undecorated/active').send({ id: 'x' });
    expect(active.status).toBe(201);
    expect(active.body).toEqual({ active: false });
  });
});
