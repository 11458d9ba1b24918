import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { RunningApp } from '../support/app.js';
import type { CountingDownstream } from '../support/counting-downstream.js';
import type { TestDatabase } from '../support/database.js';
import { startFaultApp, type FaultApp } from '../support/fault-app.js';
import { expectExactlyOnce, faultReport } from '../support/fault-report.js';
import type { PostgresServer } from '../support/postgres-server.js';
import { startSender } from '../support/retrying-sender.js';
import { waitUntil } from '../support/wait-until.js';

/**
 * The outage's length: longer than the library's resends of a fenced update on a fresh
 * connection (about 300 ms), so that a completion caught by the outage must outlast it.
 */
const OUTAGE_MS = 1_500;
/** 503s the sender must have been answered during the outage before the server comes back. */
const ANSWERS_WHILE_DOWN = 10;
/**
 * Longer than any outage this test makes (the wait for 503s is bounded at 20 s, then the restart),
 * so that a lease taken just before the outage is still live when the server is back and its
 * completion, resent meanwhile, lands. A loaded run once stretched the outage to 6.9 s, past a 6 s
 * lease: the completions gave up at the lease's end and two copies re-claimed and re-ran.
 */
const LEASE_MS = 30_000;
/**
 * Deliveries in flight at once. An external-mode delivery whose completion was caught by the outage
 * waits for it (until the lease ends), and so does every copy of its event waiting in process; with
 * the sender's default of 8, such waits could take every slot, no send could be answered 503, and
 * the outage lasted until the leases ran out. 32 leaves slots for new events while they wait.
 */
const CONCURRENCY = 32;
const RETRY_AFTER_SECONDS = 5;
/** A real API's latency: handlers are caught between their call and their completion. */
const DOWNSTREAM_LATENCY_MS = 100;

/**
 * Postgres restarted mid-traffic (a fast shutdown: sessions terminated, new ones refused, then
 * the same server back on the same port): while it is down every delivery is answered 503 +
 * Retry-After, never 200 and never a bare 500; the app recovers on its own, without a restart;
 * and every event ends with exactly one effect. The app reaches the server directly.
 */
describe('fault: Postgres restarted mid-traffic', () => {
  let system: FaultApp;
  let server: PostgresServer;
  let db: TestDatabase;
  let downstream: CountingDownstream;
  let running: RunningApp;

  beforeAll(async () => {
    system = await startFaultApp({
      adapter: 'express',
      ownServer: true,
      applicationName: 'faults-restart',
      idempotency: { leaseMs: LEASE_MS, retryAfterSeconds: RETRY_AFTER_SECONDS },
      downstreamLatencyMs: DOWNSTREAM_LATENCY_MS,
    });
    ({ db, downstream, running } = system);
    server = system.server!;
  }, 120_000);

  afterAll(async () => {
    await system?.close();
  });

  it.each(['transaction', 'external'] as const)(
    '%s mode: 503 + Retry-After while down, recovery without a restart, nothing lost or doubled',
    async (mode) => {
      const sender = startSender({
        targets: () => [running.url],
        path: mode === 'transaction' ? '/orders' : '/external',
        events: 200,
        idPrefix: `restart_${mode}`,
        eventsPerSecond: 60,
        concurrency: CONCURRENCY,
        deadlineMs: 60_000,
      });
      // The outage begins once traffic is flowing, and lasts until the sender has been told to
      // come back later, repeatedly, and for OUTAGE_MS.
      await waitUntil(() => sender.acknowledgedEvents() >= 40, 'a fifth of the events acknowledged');
      const down = Date.now();
      await server.halt();
      const unavailableBefore = sender.answered(503);
      await waitUntil(
        () =>
          sender.answered(503) >= unavailableBefore + ANSWERS_WHILE_DOWN && Date.now() - down >= OUTAGE_MS,
        'answers 503 during the outage',
        20_000,
        10,
      );
      const acknowledgedWhileDown = sender.acknowledgedEvents();
      await server.resume();
      const outageMs = Date.now() - down;
      // The margin the completions' resends need (see LEASE_MS).
      expect(outageMs).toBeLessThan(LEASE_MS);
      const sent = await sender.result;

      const report = await faultReport({
        fault: `Postgres stopped for ${outageMs} ms, then started again`,
        mode,
        scope: mode === 'transaction' ? 'FaultsController.order' : 'FaultsController.external',
        sent,
        db,
        downstream,
      });
      expectExactlyOnce(report);
      // The outage was seen (and answered 503 with Retry-After: anything else is unexpected), and
      // the app came back by itself: events were acknowledged after the server returned.
      expect(report.answers['503']).toBeGreaterThanOrEqual(ANSWERS_WHILE_DOWN);
      expect(sent.eventIds.length).toBeGreaterThan(acknowledgedWhileDown);
    },
    120_000,
  );
});
