import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { NestFactory } from '@nestjs/core';
import request from 'supertest';
import type { IdempotencyModuleOptions } from '../../lib/index.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { parkDelivery } from '../support/parked-delivery.js';
import {
  AsyncConfigAppModule,
  InvalidOptionsAppModule,
  NamedDataSourceAppModule,
} from '../fixtures/module-config.fixture.js';

describe.each(onAdapter('fastify'))('module configuration (%s)', (adapter) => {
  let main: TestDatabase;
  let webhooks: TestDatabase;
  const apps: RunningApp[] = [];

  beforeAll(async () => {
    main = await createTestDatabase();
    webhooks = await createTestDatabase();
  });

  afterAll(async () => {
    await Promise.all(apps.map((running) => running.close()));
    await main?.drop();
    await webhooks?.drop();
  });

  const start = async (module: Parameters<typeof startApp>[1]) => {
    const running = await startApp(adapter, module);
    apps.push(running);
    return running;
  };
  const count = (db: TestDatabase, table: 'orders' | 'processed_events', id: string) =>
    db.count(`SELECT count(*) FROM ${table} WHERE ${table === 'orders' ? 'event_id' : 'event_key'} = $1`, [
      id,
    ]);

  it('forRootAsync: imports, inject and useFactory configure the module end to end', async () => {
    const running = await start([
      AsyncConfigAppModule.forDatabase(main.url, { duplicateWaitMs: 50, retryAfterSeconds: 7 }),
    ]);
    const id = `evt_async_${adapter}`;
    expect((await request(running.url).post('/orders').send({ id })).status).toBe(200);
    const replay = await request(running.url).post('/orders').send({ id });
    expect(replay.status).toBe(200);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(await count(main, 'orders', id)).toBe(1);

    // The factory's values are in force: a duplicate of a held claim gets its Retry-After.
    const heldId = `evt_async_held_${adapter}`;
    const { answer: held, gates } = await parkDelivery(running, '/orders', { id: heldId });
    const duplicate = await request(running.url).post('/orders').send({ id: heldId });
    expect(duplicate.status).toBe(409);
    expect(duplicate.headers['retry-after']).toBe('7');
    gates.open(heldId);
    expect((await held).status).toBe(200);
    expect(await count(main, 'orders', heldId)).toBe(1);
  });

  it.each(['forRoot', 'forRootAsync'] as const)(
    'dataSource (%s): claims and the transaction run on the named DataSource',
    async (entry) => {
      const running = await start([NamedDataSourceAppModule.forDatabases(main.url, webhooks.url, entry)]);
      const id = `evt_named_${entry}_${adapter}`;
      expect((await request(running.url).post('/orders').send({ id })).status).toBe(200);
      const replay = await request(running.url).post('/orders').send({ id });
      expect(replay.headers['idempotent-replayed']).toBe('true');

      // The claim lands in the named DataSource's database; the handler's writes, through the
      // claim's transaction, go with it. The default database sees nothing.
      expect(await count(webhooks, 'processed_events', id)).toBe(1);
      expect(await count(webhooks, 'orders', id)).toBe(1);
      expect(await count(main, 'processed_events', id)).toBe(0);
      expect(await count(main, 'orders', id)).toBe(0);
    },
  );
});

describe('module options checked at start-up', () => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterAll(async () => {
    await db?.drop();
  });

  const cases: [IdempotencyModuleOptions, string][] = [
    [{ leaseMs: 0 }, 'IdempotencyModule option leaseMs must be a positive number, got 0'],
    [{ inFlightStatus: 418 as never }, 'IdempotencyModule option inFlightStatus must be 409 or 503, got 418'],
    [
      { retryAfterSeconds: -1 },
      'IdempotencyModule option retryAfterSeconds must be a positive number, got -1',
    ],
    [
      { concurrentDuplicateWaitMs: -5 },
      'IdempotencyModule option concurrentDuplicateWaitMs must be zero or more, got -5',
    ],
    [{ leaseMss: 1000 } as never, 'IdempotencyModule has no option leaseMss; did you mean leaseMs?'],
  ];

  for (const entry of ['forRoot', 'forRootAsync'] as const) {
    it.each(cases)(`${entry} rejects %j naming the option`, async (options, message) => {
      const app = NestFactory.create(InvalidOptionsAppModule.with(db.url, options, entry), {
        logger: false,
        abortOnError: false,
      });
      await expect(app).rejects.toThrow(message);
    });
  }
});
