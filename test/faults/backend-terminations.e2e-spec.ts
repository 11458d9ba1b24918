import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { RunningApp } from '../support/app.js';
import { startBackendStorm } from '../support/backend-storm.js';
import type { CountingDownstream } from '../support/counting-downstream.js';
import type { TestDatabase } from '../support/database.js';
import { startFaultApp, type FaultApp } from '../support/fault-app.js';
import { expectExactlyOnce, faultReport } from '../support/fault-report.js';
import { startSender } from '../support/retrying-sender.js';

const APPLICATION_NAME = 'faults-terminations';
/** A real API's latency: completions are sent while the storm goes on. */
const DOWNSTREAM_LATENCY_MS = 20;
/** Sessions terminated at least, for the run to count as a storm. */
const MIN_TERMINATED = 50;

/**
 * pg_terminate_backend() storms on the app's sessions while traffic flows: claims, transactions,
 * COMMITs and fenced completions all meet terminated connections. No process dies, so every
 * event has exactly one effect and the downstream is called exactly once per event.
 */
describe('fault: pg_terminate_backend storms on the app’s sessions', () => {
  let system: FaultApp;
  let db: TestDatabase;
  let downstream: CountingDownstream;
  let running: RunningApp;

  beforeAll(async () => {
    system = await startFaultApp({
      adapter: 'fastify',
      applicationName: APPLICATION_NAME,
      idempotency: { leaseMs: 5_000, retryAfterSeconds: 5 },
      downstreamLatencyMs: DOWNSTREAM_LATENCY_MS,
    });
    ({ db, downstream, running } = system);
  });

  afterAll(async () => {
    await system?.close();
  });

  it.each(['transaction', 'external'] as const)(
    '%s mode: nothing lost, nothing doubled, no extra downstream call',
    async (mode) => {
      const storm = await startBackendStorm({
        databaseUrl: db.url,
        applicationName: APPLICATION_NAME,
        everyMs: 5,
        perRound: 1,
        maxRounds: 2_000,
        maxMs: 60_000,
      });
      const sender = startSender({
        targets: () => [running.url],
        path: mode === 'transaction' ? '/orders' : '/external',
        events: 200,
        idPrefix: `storm_${mode}`,
        eventsPerSecond: 80,
        concurrency: 8,
        deadlineMs: 60_000,
      });
      const sent = await sender.result;
      const stormed = await storm.stop();

      const report = await faultReport({
        fault: `pg_terminate_backend storm (${stormed.terminated} sessions terminated in ${stormed.rounds} rounds)`,
        mode,
        scope: mode === 'transaction' ? 'FaultsController.order' : 'FaultsController.external',
        sent,
        db,
        downstream,
      });
      expectExactlyOnce(report);
      expect(stormed.terminated).toBeGreaterThanOrEqual(MIN_TERMINATED);
    },
    90_000,
  );
});
