import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { IdempotencyService, isIdempotencyError, REPLAYED_HEADER } from 'nest-idempotent-webhooks';
import { InvalidIdempotencyKeyError } from 'nest-idempotent-webhooks/errors';
import { IdempotencyHealthIndicator, IdempotencyMetrics } from 'nest-idempotent-webhooks/observability';
import { IdempotencyClaims } from 'nest-idempotent-webhooks/operator';
import { runAsWebhookDelivery } from 'nest-idempotent-webhooks/testing';
import { register } from 'prom-client';
// supertest is CommonJS with `export =`: without esModuleInterop (classic), this is how to call it.
// eslint-disable-next-line @typescript-eslint/no-require-imports
import request = require('supertest');
import { DataSource } from 'typeorm';
import { AppModule } from './app.module';
import { OrdersService } from './orders.service';

// A CommonJS Nest 11 app as `nest new` makes it, with the package installed from its tarball:
// ts-jest compiles this file to require() calls, so Jest loads the package's CommonJS build.
describe('the same event delivered twice', () => {
  let app: INestApplication;
  let dataSource: DataSource;

  beforeAll(async () => {
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    app = moduleRef.createNestApplication();
    await app.init();
    dataSource = app.get(DataSource);
  });

  afterAll(async () => {
    await app?.close();
  });

  it('runs the handler once and replays the second delivery', async () => {
    const first = await request(app.getHttpServer()).post('/webhooks/orders').send({ id: 'evt_cjs_1' });
    expect(first.status).toBe(200);
    expect(first.body).toEqual({ recorded: 'evt_cjs_1' });

    const second = await request(app.getHttpServer()).post('/webhooks/orders').send({ id: 'evt_cjs_1' });
    expect(second.status).toBe(200);
    expect(second.headers[REPLAYED_HEADER.toLowerCase()]).toBe('true');

    const orders = await dataSource.query(`SELECT event_id FROM orders WHERE event_id = 'evt_cjs_1'`);
    expect(orders).toHaveLength(1);
    const claims = await dataSource.query(
      `SELECT status FROM processed_events WHERE event_key = 'evt_cjs_1'`,
    );
    expect(claims).toEqual([{ status: 'done' }]);
  });

  it('counts both outcomes, in-process and in prom-client (an optional peer, loaded lazily)', async () => {
    const scope = 'WebhookController.handle';
    expect(app.get(IdempotencyMetrics).snapshot().claims[scope]).toMatchObject({ claimed: 1, replayed: 1 });
    const counter = (await register.getSingleMetric('idempotency_claims_total')?.get())?.values ?? [];
    const count = (outcome: string) =>
      counter.find((value) => value.labels.scope === scope && value.labels.outcome === outcome)?.value;
    expect([count('claimed'), count('replayed')]).toEqual([1, 1]);
  });

  it('injects what the /operator and /observability entry points export, and raises the classes of /errors', async () => {
    // The classes of the subpaths are the ones IdempotencyModule provides: Nest finds them by identity.
    const claim = await app.get(IdempotencyClaims).show('WebhookController.handle', 'evt_cjs_1');
    expect(claim).toMatchObject({ key: 'evt_cjs_1', status: 'done', poison: false });
    const health = await app.get(IdempotencyHealthIndicator).isHealthy();
    expect(health.idempotency.status).toBe('up');

    const refused: unknown = await app
      .get(IdempotencyService)
      .run({ scope: 'Entries.check', key: '' }, () => 'never run')
      .then(
        () => undefined,
        (error: unknown) => error,
      );
    expect(refused).toBeInstanceOf(InvalidIdempotencyKeyError);
    expect(isIdempotencyError(refused, 'IDEMPOTENCY_INVALID_KEY')).toBe(true);
    expect(await dataSource.query(`SELECT 1 FROM processed_events WHERE scope = 'Entries.check'`)).toEqual(
      [],
    );
  });

  it('lets a service run as a delivery through the /testing entry point', async () => {
    const orders = app.get(OrdersService);
    await dataSource.transaction((manager) =>
      runAsWebhookDelivery({ key: 'evt_cjs_unit', manager }, () => orders.record('evt_cjs_unit')),
    );
    const rows = await dataSource.query(`SELECT event_id FROM orders WHERE event_id = 'evt_cjs_unit'`);
    expect(rows).toHaveLength(1);
  });
});
