import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Module, Post } from '@nestjs/common';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import { TypeOrmModule } from '@nestjs/typeorm';
import type Stripe from 'stripe';
import { DataSource, type EntityManager } from 'typeorm';
import {
  idempotencyEntities,
  IdempotencyModule,
  IdempotentWebhook,
  processedEventsMigrations,
  stripeEventKey,
  WebhookTransaction,
} from '../../../lib/index.js';
import { expectCrashRecovery, expectOneEffect } from '../../../lib/testing/index.js';
import { signedStripeDelivery } from './signed-delivery.js';

const SECRET = 'whsec_test_only';

@Controller('webhooks')
class StripeController {
  @Post('stripe')
  @IdempotentWebhook({ key: stripeEventKey, signature: 'stripe' })
  async handle(@Body() event: Stripe.Event, @WebhookTransaction() manager: EntityManager): Promise<void> {
    await manager.query('INSERT INTO stripe_events (event_id) VALUES ($1)', [event.id]);
  }
}

@Module({
  imports: [
    TypeOrmModule.forRoot({
      type: 'postgres',
      url: process.env.DATABASE_URL,
      entities: [...idempotencyEntities()],
      migrations: [...processedEventsMigrations()],
      migrationsRun: true,
    }),
    IdempotencyModule.forRoot({
      signatures: { stripe: { secret: SECRET } },
      // A write outside the claim's transaction fails the delivery, and the test, instead of a
      // warning the test runner may not show.
      strictTransactions: true,
    }),
  ],
  controllers: [StripeController],
})
class StripeTestModule {}

describe('Stripe webhooks on Fastify: one event, one effect', () => {
  let app: NestFastifyApplication;
  let dataSource: DataSource;

  beforeAll(async () => {
    const moduleRef = await Test.createTestingModule({ imports: [StripeTestModule] }).compile();
    // rawBody: the signature is checked over the bytes Stripe signed.
    app = moduleRef.createNestApplication<NestFastifyApplication>(new FastifyAdapter(), { rawBody: true });
    await app.init();
    await app.getHttpAdapter().getInstance().ready();
    dataSource = app.get(DataSource);
    // Your own migrations create this; here for brevity.
    await dataSource.query('CREATE TABLE IF NOT EXISTS stripe_events (event_id text NOT NULL)');
  });

  afterAll(async () => {
    await app?.close();
  });

  /** One delivery of the event `id`, as Stripe signs it (with `secret`, the app's by default). */
  const stripe = (id: string, secret = SECRET) =>
    signedStripeDelivery(
      app.getHttpServer(),
      '/webhooks/stripe',
      { id, object: 'event', type: 'payment_intent.succeeded', data: { object: {} } },
      secret,
    );
  const recorded = async (id: string) =>
    Number((await dataSource.query('SELECT count(*) FROM stripe_events WHERE event_id = $1', [id]))[0].count);

  it('records one event, delivered five times at once and once more', async () => {
    await expectOneEffect({
      deliver: stripe('evt_fastify_1'),
      effect: () => recorded('evt_fastify_1'),
    });
  });

  it('records one event when a delivery dies before its COMMIT', async () => {
    await expectCrashRecovery({
      deliver: stripe('evt_fastify_2'),
      effect: () => recorded('evt_fastify_2'),
      scope: 'StripeController.handle',
      key: 'evt_fastify_2',
    });
  });

  it('refuses an event signed with another secret, and records nothing', async () => {
    const forged = await stripe('evt_fastify_3', 'whsec_other')();
    expect(forged.status).toBe(401);
    expect(await recorded('evt_fastify_3')).toBe(0);
  });
});
