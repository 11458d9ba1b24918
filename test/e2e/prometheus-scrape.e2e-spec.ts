import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { asGrafanaSends, dashboardExpressions, RULES_FILE } from '../support/observability-files.js';
import {
  startPrometheus,
  type PrometheusAlert,
  type PrometheusServer,
} from '../support/prometheus-server.js';
import { FakeFulfilmentApi } from '../support/sample-downstream.js';
import { killAllSamples, startSample, type SampleProcess } from '../support/sample-process.js';
import { checkoutSessionCompleted, deliver, FULFILMENT } from '../support/sample-stripe.js';
import { waitUntil } from '../support/wait-until.js';

/** The library's default maxAttempts, which the sample keeps: a claim is poison after that many. */
const MAX_ATTEMPTS = 5;
/** Scrape and evaluation run every second, the sample's reporter too: the alert fires in seconds. */
const ALERT_FIRES_MS = 60_000;

/**
 * A real Prometheus scrapes the sample's GET /metrics and evaluates the shipped alert rules: an
 * event whose handler fails on every delivery becomes a poison event, the reporter's gauge says
 * so, and IdempotencyPoisonEvents fires. Every dashboard query then runs against the same data.
 */
describe('the alert rules against a real Prometheus scraping the sample', () => {
  let db: TestDatabase;
  let api: FakeFulfilmentApi;
  let sample: SampleProcess;
  let prometheus: PrometheusServer | undefined;

  beforeAll(async () => {
    db = await createTestDatabase(undefined, { fixtureSchema: false });
    api = await FakeFulfilmentApi.start();
    sample = await startSample({ databaseUrl: db.url, fulfilmentUrl: api.url, reportIntervalMs: 1_000 });
    prometheus = await startPrometheus({ target: new URL(sample.url).host, ruleFiles: [RULES_FILE] });
  });

  afterAll(async () => {
    await prometheus?.stop();
    await killAllSamples();
    await api?.close();
    await db?.drop();
  });

  it('fires IdempotencyPoisonEvents once an event has failed maxAttempts times', async () => {
    // Healthy first: scraped, and nothing firing.
    await waitUntil(
      async () => (await prometheus!.query('up{job="sample"}')).data.result[0]?.value[1] === '1',
      'the first scrape of the sample',
    );
    expect(await prometheus!.alerts()).toEqual([]);

    const event = checkoutSessionCompleted('evt_prom_poison', 'poison@example.com');
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      api.answerNext(500);
      expect((await deliver(sample.url, FULFILMENT, event)).status).toBe(502);
    }
    expect(api.callsFor('evt_prom_poison')).toHaveLength(MAX_ATTEMPTS);
    const { rows } = await db.pool.query(
      `SELECT status, attempts FROM processed_events WHERE event_key = 'evt_prom_poison'`,
    );
    expect(rows).toEqual([{ status: 'failed', attempts: MAX_ATTEMPTS }]);

    let poison: PrometheusAlert | undefined;
    await waitUntil(
      async () => {
        poison = (await prometheus!.alerts()).find(
          (alert) => alert.labels.alertname === 'IdempotencyPoisonEvents' && alert.state === 'firing',
        );
        return poison !== undefined;
      },
      'IdempotencyPoisonEvents to fire',
      ALERT_FIRES_MS,
      250,
    );
    expect(poison).toMatchObject({
      labels: { alertname: 'IdempotencyPoisonEvents', severity: 'warning' },
      annotations: { summary: '1 webhook event(s) failed on every delivery' },
    });
    // What it fired on, as Prometheus scraped it.
    expect((await prometheus!.query('max(idempotency_poison_events)')).data.result[0]?.value[1]).toBe('1');
    const failed = await prometheus!.query(
      'sum(idempotency_claims_total{scope="stripe.fulfilment",outcome="failed"})',
    );
    expect(failed.data.result[0]?.value[1]).toBe(String(MAX_ATTEMPTS));
    // No other alert: the failures are the handler's, not the database's (no 503s), and no lease was lost.
    const others = (await prometheus!.alerts()).filter(
      (a) => a.labels.alertname !== 'IdempotencyPoisonEvents',
    );
    expect(others).toEqual([]);
  });

  it("runs every dashboard query on the scraped series, the failed deliveries' durations included", async () => {
    for (const { panel, expr } of dashboardExpressions()) {
      const answer = await prometheus!.query(asGrafanaSends(expr));
      expect({ panel, status: answer.status, error: answer.error }).toEqual({
        panel,
        status: 'success',
        error: undefined,
      });
    }
    const failedClaims = await prometheus!.query(
      'sum(idempotency_claim_duration_seconds_count{scope="stripe.fulfilment",result="failed"})',
    );
    expect(failedClaims.data.result[0]?.value[1]).toBe(String(MAX_ATTEMPTS));
    const handlerErrors = await prometheus!.query(
      'sum(idempotency_handler_duration_seconds_count{scope="stripe.fulfilment",result="error"})',
    );
    expect(handlerErrors.data.result[0]?.value[1]).toBe(String(MAX_ATTEMPTS));
  });
});
