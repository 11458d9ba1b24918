import { expect } from '@jest/globals';
import type { ClientProxy } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import request from 'supertest';
import type { DataSource } from 'typeorm';
import {
  crashBeforeCommit,
  deliveryOutcome,
  expectOneEffect,
  expireLease,
  runAsWebhookDelivery,
} from '../../../lib/testing/index.js';
import type { PaymentEvent } from './payments.controller.js';

/**
 * The shorter code blocks of docs/testing.md, each a region here so that it type-checks
 * (test/unit/docs-testing.spec.ts checks the page shows them as written). The parameters stand
 * for what the surrounding test would have.
 */
export interface SnippetContext {
  server: Parameters<typeof request>[0];
  client: ClientProxy;
  dataSource: DataSource;
  event: PaymentEvent;
  payments: (id: string) => Promise<number>;
  ledger: { record(event: PaymentEvent): Promise<unknown> };
  paymentsService: { record(event: PaymentEvent): Promise<void> };
  receipts: { key: string; eventId: string }[];
  waitFor: (condition: () => boolean | Promise<boolean>) => Promise<void>;
  jobDone: (eventId: string) => Promise<boolean>;
  send: (event: PaymentEvent) => Promise<unknown>;
}

export async function snippets(context: SnippetContext): Promise<void> {
  const { server, client, dataSource, event, payments, ledger, paymentsService } = context;
  const { receipts, waitFor, jobDone, send } = context;

  // #region rpc
  await expectOneEffect({
    // A handler that returns nothing answers nothing (a replay, its stored nothing): default it.
    deliver: () => lastValueFrom(client.send('payments.record', event), { defaultValue: undefined }),
    effect: () => payments(event.id),
  });
  // #endregion

  // #region method
  await expectOneEffect({ deliver: () => ledger.record(event), effect: () => payments(event.id) });
  // #endregion

  // #region outcome
  await expectOneEffect({
    deliver: () => request(server).post('/webhooks/payments').send(event),
    effect: () => payments(event.id),
    // This app's exception filter answers 200 { retry: true } where the library says 409 or 503.
    outcome: (settled) =>
      settled.resolved && (settled.value as { body?: { retry?: boolean } }).body?.retry
        ? 'retry'
        : deliveryOutcome(settled),
  });
  // #endregion

  // #region worker
  const disarm = crashBeforeCommit({ scope: 'ReceiptsWorker.send', key: event.id });
  try {
    await send(event); // the endpoint queues the job; the worker calls the API, then "dies"
    await waitFor(() => receipts.length === 1);
  } finally {
    disarm();
  }
  await expireLease(dataSource, 'ReceiptsWorker.send', event.id); // as if leaseMs had passed
  await waitFor(() => jobDone(event.id)); // the queue's retry re-claims it and calls again
  expect(new Set(receipts.map((receipt) => receipt.key)).size).toBe(1);
  // #endregion

  // #region service
  await dataSource.transaction((manager) =>
    runAsWebhookDelivery({ key: 'evt_1', manager }, () => paymentsService.record(event)),
  );
  // #endregion
}
