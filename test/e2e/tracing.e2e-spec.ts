import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { SpanKind, SpanStatusCode } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { Registry } from 'prom-client';
import request from 'supertest';
import { IdempotencyService, type HandoffOptions } from '../../lib/index.js';
import {
  HandoffFixtureModule,
  TX_QUEUE,
  TX_WORKER_SCOPE,
  WEBHOOK_SCOPE,
} from '../fixtures/handoff.fixture.js';
import { MicroserviceFixtureController, MICROSERVICE_PATTERNS } from '../fixtures/microservice.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { observe, startMicroservice, type RunningMicroservice } from '../support/microservice-app.js';
import { histogramCount, installTelemetrySdk, pointWith } from '../support/telemetry-sdk.js';
import { waitUntil } from '../support/wait-until.js';

// Before any app boots: the library takes the global tracer and meter at init.
const sdk = installTelemetrySdk();

const ORDER_SCOPE = 'FixtureController.order';
const EXTERNAL_SCOPE = 'FixtureController.external';

/** The delivery span of `key` under `scope`, in end order. */
const deliverySpans = (scope: string, key: string) => (span: ReadableSpan) =>
  span.name === `process ${scope}` && span.attributes['messaging.message.id'] === key;

/** The handler spans whose parent is `delivery`. */
const handlerSpansOf = (delivery: ReadableSpan) =>
  sdk
    .spans()
    .filter(
      (span) =>
        span.name.startsWith('handler ') && span.parentSpanContext?.spanId === delivery.spanContext().spanId,
    );

const eventNames = (span: ReadableSpan) => span.events.map((event) => event.name);

/** The count of `metric`'s series with `labels` in `registry` (a histogram's _count, say). */
async function seriesValue(registry: Registry, metric: string, name: string, labels: Record<string, string>) {
  const { values } = await registry.getSingleMetric(metric)!.get();
  const found = (values as { metricName?: string; labels: Record<string, unknown>; value: number }[]).find(
    (value) => value.metricName === name && Object.entries(labels).every(([k, v]) => value.labels[k] === v),
  );
  return found?.value ?? 0;
}

describe.each(ADAPTERS)('a span and duration histograms per delivery over HTTP (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  const registry = new Registry();

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        idempotency: { prometheus: { registers: [registry] }, reporter: false },
      }),
    ]);
  });

  afterEach(() => running?.app.get(Gates).openAll());

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const post = (path: string, body: object) => request(running.url).post(path).send(body);

  it('makes a processed delivery a consumer span with a handler child and a commit, and a replay one without', async () => {
    const id = `evt_tr_ok_${adapter}`;
    expect((await post('/orders', { id })).status).toBe(200);
    expect((await post('/orders', { id })).headers['idempotent-replayed']).toBe('true');
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(1);

    const [first, replay] = await sdk.waitForSpans(deliverySpans(ORDER_SCOPE, id), 2);
    expect(first!.kind).toBe(SpanKind.CONSUMER);
    expect(first!.attributes).toMatchObject({
      'messaging.system': 'webhook',
      'messaging.operation.type': 'process',
      'messaging.operation.name': 'process',
      'messaging.message.id': id,
      'messaging.destination.name': '/orders',
      'idempotency.scope': ORDER_SCOPE,
      'idempotency.mode': 'transaction',
      'idempotency.outcome': 'claimed',
    });
    expect(eventNames(first!)).toEqual(['claim', 'commit']);
    expect(first!.status.code).toBe(SpanStatusCode.UNSET);
    const [handler] = handlerSpansOf(first!);
    expect(handler?.name).toBe(`handler ${ORDER_SCOPE}`);
    // The handler ran inside the claim: its span starts after the delivery's and ends before it.
    expect(handler!.spanContext().traceId).toBe(first!.spanContext().traceId);
    expect(eventNames(replay!)).toEqual([]);
    expect(replay!.attributes['idempotency.outcome']).toBe('replayed');
    expect(handlerSpansOf(replay!)).toEqual([]);
  });

  it('records a failed handler on its span and on the delivery span, and writes no order', async () => {
    const id = `evt_tr_fail_${adapter}`;
    expect((await post('/orders', { id, fail: true })).status).toBe(500);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(0);

    const [delivery] = await sdk.waitForSpans(deliverySpans(ORDER_SCOPE, id));
    expect(delivery!.attributes['idempotency.outcome']).toBe('failed');
    expect(delivery!.status).toEqual({ code: SpanStatusCode.ERROR, message: 'handler failed on purpose' });
    expect(eventNames(delivery!)).toEqual(['claim', 'exception']);
    const [handler] = handlerSpansOf(delivery!);
    expect(handler!.status.code).toBe(SpanStatusCode.ERROR);
    expect(handler!.events[0]?.attributes?.['exception.message']).toBe('handler failed on purpose');
  });

  it('gives an external-mode delivery its attempt and a completion, and a re-claim its outcome', async () => {
    const id = `evt_tr_ext_${adapter}`;
    expect((await post('/external', { id, fail: true })).status).toBe(500);
    const retried = await post('/external', { id });
    expect(retried.body).toEqual({ processed: id, attempt: 2 });
    expect(await db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [id])).toBe(1);

    const [failed, reclaimed] = await sdk.waitForSpans(deliverySpans(EXTERNAL_SCOPE, id), 2);
    expect(failed!.attributes).toMatchObject({
      'idempotency.mode': 'external',
      'idempotency.attempt': 1,
      'idempotency.outcome': 'failed',
    });
    expect(reclaimed!.attributes).toMatchObject({
      'idempotency.mode': 'external',
      'idempotency.attempt': 2,
      'idempotency.outcome': 'reclaimed',
      'messaging.destination.name': '/external',
    });
    expect(eventNames(reclaimed!)).toEqual(['claim', 'completion']);
  });

  it('times claims and handlers in prom-client and on the OpenTelemetry meter, under the same labels', async () => {
    const id = `evt_tr_hist_${adapter}`;
    // The meter is the process's, shared by both adapters' apps: its histograms are read as deltas.
    const otelCount = async (name: string, labels: Record<string, string>) =>
      histogramCount(pointWith((await sdk.collect()).get(name), labels));
    const processed = { scope: ORDER_SCOPE, result: 'processed' };
    const replayed = { scope: ORDER_SCOPE, result: 'replayed' };
    const before = {
      processed: await otelCount('idempotency.claim.duration', processed),
      replayed: await otelCount('idempotency.claim.duration', replayed),
      handled: await otelCount('idempotency.handler.duration', { scope: ORDER_SCOPE, result: 'ok' }),
    };
    expect((await post('/orders', { id })).status).toBe(200);
    expect((await post('/orders', { id })).status).toBe(200);

    const count = (name: string, labels: Record<string, string>) =>
      seriesValue(registry, 'idempotency_claim_duration_seconds', name, labels);
    // This file's earlier tests sent one processed, one replayed and one failed delivery each.
    expect(await count('idempotency_claim_duration_seconds_count', processed)).toBe(2);
    expect(await count('idempotency_claim_duration_seconds_count', replayed)).toBe(2);
    const failed = { scope: ORDER_SCOPE, result: 'failed' };
    expect(await count('idempotency_claim_duration_seconds_count', failed)).toBe(1);
    expect(await count('idempotency_claim_duration_seconds_sum', processed)).toBeGreaterThan(0);
    const handlerCount = (result: string) =>
      seriesValue(
        registry,
        'idempotency_handler_duration_seconds',
        'idempotency_handler_duration_seconds_count',
        {
          scope: ORDER_SCOPE,
          result,
        },
      );
    expect(await handlerCount('ok')).toBe(2);
    expect(await handlerCount('error')).toBe(1);

    const collected = await sdk.collect();
    expect(collected.get('idempotency.claim.duration')?.descriptor.unit).toBe('s');
    expect((await otelCount('idempotency.claim.duration', processed)) - before.processed).toBe(1);
    expect((await otelCount('idempotency.claim.duration', replayed)) - before.replayed).toBe(1);
    const handled = await otelCount('idempotency.handler.duration', { scope: ORDER_SCOPE, result: 'ok' });
    expect(handled - before.handled).toBe(1);
    // The counters, read from this app's totals (as idempotency_claims_total is): the other
    // adapter's app stopped reporting when it closed.
    const claimed = pointWith<number>(collected.get('idempotency.claims'), {
      scope: ORDER_SCOPE,
      outcome: 'claimed',
    });
    expect(claimed?.value).toBe(2);
  });
});

describe('a span per delivery of a microservice handler (TCP), and of IdempotencyService.run()', () => {
  let db: TestDatabase;
  let service: RunningMicroservice;
  const registry = new Registry();

  beforeAll(async () => {
    db = await createTestDatabase();
    service = await startMicroservice('tcp', {
      databaseUrl: db.url,
      idempotency: { reporter: false, prometheus: { registers: [registry] } },
    });
  });

  afterAll(async () => {
    await service?.close();
    await db?.drop();
  });

  it('names the transport and the pattern, and counts the outcome on the span', async () => {
    const id = 'evt_tr_tcp';
    const reply = await observe(service.client.send(MICROSERVICE_PATTERNS.order, { id }));
    expect(reply).toEqual({ values: [{ processed: id, amount: 1 }] });
    await observe(service.client.send(MICROSERVICE_PATTERNS.order, { id }));
    expect(service.app.get(MicroserviceFixtureController).callsFor('message', id)).toBe(1);

    const [first, replay] = await sdk.waitForSpans(
      deliverySpans('MicroserviceFixtureController.createOrder', id),
      2,
    );
    expect(first!.attributes).toMatchObject({
      'messaging.system': 'tcp',
      'messaging.destination.name': MICROSERVICE_PATTERNS.order,
      'messaging.message.id': id,
      'idempotency.outcome': 'claimed',
    });
    expect(handlerSpansOf(first!)).toHaveLength(1);
    expect(replay!.attributes['idempotency.outcome']).toBe('replayed');
    const scope = { scope: 'MicroserviceFixtureController.createOrder' };
    const claims = (result: string) =>
      seriesValue(
        registry,
        'idempotency_claim_duration_seconds',
        'idempotency_claim_duration_seconds_count',
        {
          ...scope,
          result,
        },
      );
    expect([await claims('processed'), await claims('replayed')]).toEqual([1, 1]);
    expect(
      await seriesValue(
        registry,
        'idempotency_handler_duration_seconds',
        'idempotency_handler_duration_seconds_count',
        { ...scope, result: 'ok' },
      ),
    ).toBe(1);
  });

  it("makes IdempotencyService.run() a delivery span named after its scope, inside the caller's span", async () => {
    const { trace } = await import('@opentelemetry/api');
    const idempotency = service.app.get(IdempotencyService);
    const result = await trace
      .getTracer('test')
      .startActiveSpan('nightly import run', (caller) =>
        idempotency
          .run({ scope: 'Imports.nightly', key: 'evt_tr_run' }, ({ manager }) =>
            manager.query('INSERT INTO orders (event_id) VALUES ($1)', ['evt_tr_run']),
          )
          .finally(() => caller.end()),
      );
    expect(result.status).toBe('processed');
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', ['evt_tr_run'])).toBe(1);
    const [delivery] = await sdk.waitForSpans(deliverySpans('Imports.nightly', 'evt_tr_run'));
    const [caller] = sdk.spans().filter((span) => span.name === 'nightly import run');
    expect(delivery!.parentSpanContext?.spanId).toBe(caller!.spanContext().spanId);
    expect(delivery!.attributes).toMatchObject({
      'messaging.system': 'method',
      'messaging.destination.name': 'Imports.nightly',
      'idempotency.outcome': 'claimed',
    });
  });
});

describe('the handoff carries the trace into the worker', () => {
  let db: TestDatabase;
  let running: RunningApp;
  const registry = new Registry();
  const handoff: HandoffOptions = {
    schema: 'tracing_jobs',
    pollingIntervalMs: 100,
    queues: { [TX_QUEUE]: { retryLimit: 0, expireInSeconds: 30 } },
  };

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp('express', [
      HandoffFixtureModule.forSettings({
        databaseUrl: db.url,
        web: true,
        workers: ['tx'],
        idempotency: { handoff, reporter: false, prometheus: { registers: [registry] } },
      }),
    ]);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  it("continues the webhook's trace in the worker's span, as a child of the handler that enqueued it", async () => {
    const id = 'evt_tr_handoff';
    const answer = await request(running.url).post('/webhook').send({ id });
    expect(answer.status).toBe(200);
    await waitUntil(
      async () => (await db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [id])) === 1,
      'the worker to run the job',
    );

    const [webhook] = await sdk.waitForSpans(deliverySpans(WEBHOOK_SCOPE, id));
    // The worker's claim is the job's: its key, by default the job's id.
    const { jobId } = answer.body as { jobId: string };
    const [worker] = await sdk.waitForSpans(deliverySpans(TX_WORKER_SCOPE, jobId));
    const [enqueuing] = handlerSpansOf(webhook!);
    expect(worker!.spanContext().traceId).toBe(webhook!.spanContext().traceId);
    expect(worker!.parentSpanContext?.spanId).toBe(enqueuing!.spanContext().spanId);
    expect(worker!.parentSpanContext?.isRemote).toBe(true);
    expect(worker!.attributes).toMatchObject({
      'messaging.system': 'pg-boss',
      'messaging.destination.name': TX_QUEUE,
      'messaging.message.id': jobId,
      'idempotency.scope': TX_WORKER_SCOPE,
      'idempotency.outcome': 'claimed',
    });
    expect(eventNames(worker!)).toEqual(['claim', 'commit']);
    expect(handlerSpansOf(worker!)).toHaveLength(1);
    // The worker's delivery is timed like any other, under its own scope.
    const processed = { scope: TX_WORKER_SCOPE, result: 'processed' };
    expect(
      await seriesValue(
        registry,
        'idempotency_claim_duration_seconds',
        'idempotency_claim_duration_seconds_count',
        processed,
      ),
    ).toBe(1);
    const handled = { scope: TX_WORKER_SCOPE, result: 'ok' };
    expect(
      await seriesValue(
        registry,
        'idempotency_handler_duration_seconds',
        'idempotency_handler_duration_seconds_count',
        handled,
      ),
    ).toBe(1);
  });
});
