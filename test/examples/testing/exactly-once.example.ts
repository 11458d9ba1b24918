import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { expectCrashRecovery, expectOneEffect } from '../../../lib/testing/index.js';
import { AppModule } from './app.module.js';
import type { PaymentEvent } from './payments.controller.js';

/** The receipts API, stood in by a real HTTP server that records every call it gets. */
const receipts: { key: string; eventId: string }[] = [];
const receiptsApi = createServer(async (req, res) => {
  let body = '';
  for await (const chunk of req) body += chunk;
  receipts.push({ key: String(req.headers['idempotency-key']), eventId: JSON.parse(body).eventId });
  res.end('{}');
});

describe('payment webhooks: one event, one effect', () => {
  let app: INestApplication;
  let dataSource: DataSource;

  beforeAll(async () => {
    await new Promise<void>((listening) => receiptsApi.listen(0, '127.0.0.1', listening));
    process.env.RECEIPTS_URL = `http://127.0.0.1:${(receiptsApi.address() as AddressInfo).port}`;
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    app = await moduleRef.createNestApplication().init();
    dataSource = app.get(DataSource);
    // Your own migrations create this; here for brevity.
    await dataSource.query(
      'CREATE TABLE IF NOT EXISTS payments (event_id text NOT NULL, amount integer NOT NULL)',
    );
  });

  afterAll(async () => {
    await app?.close();
    receiptsApi.close();
  });

  const post = (path: string, event: PaymentEvent) => () =>
    request(app.getHttpServer()).post(path).send(event);
  const payments = async (id: string) =>
    Number((await dataSource.query('SELECT count(*) FROM payments WHERE event_id = $1', [id]))[0].count);
  /** Calls the receipts API got for the event. */
  const receiptCalls = (id: string) => receipts.filter((receipt) => receipt.eventId === id).length;
  /** Receipts as an API that dedupes by Idempotency-Key applies them: one per distinct key. */
  const receiptsSent = (id: string) =>
    new Set(receipts.filter((receipt) => receipt.eventId === id).map((receipt) => receipt.key)).size;

  it('records one payment, delivered five times at once and once more', async () => {
    const event = { id: 'evt_payment_1', amount: 4200 };
    await expectOneEffect({ deliver: post('/webhooks/payments', event), effect: () => payments(event.id) });
  });

  it('records one payment when a delivery dies before its COMMIT', async () => {
    const event = { id: 'evt_payment_2', amount: 4200 };
    await expectCrashRecovery({
      deliver: post('/webhooks/payments', event),
      effect: () => payments(event.id),
      scope: 'PaymentsController.payment',
      key: event.id,
    });
  });

  it('sends one receipt, even when the worker dies after sending it', async () => {
    const event = { id: 'evt_receipt_1', amount: 4200 };
    await expectOneEffect({
      deliver: post('/webhooks/receipts', event),
      // No crash: exactly one call.
      effect: () => receiptCalls(event.id),
    });
    const crashed = { id: 'evt_receipt_2', amount: 4200 };
    await expectCrashRecovery({
      deliver: post('/webhooks/receipts', crashed),
      // The crash came after the call, so it is made again: still one receipt if its key is the same.
      effect: () => receiptsSent(crashed.id),
      external: true,
      dataSource,
      scope: 'PaymentsController.receipt',
      key: crashed.id,
    });
  });
});
