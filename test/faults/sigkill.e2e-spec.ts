import { resolve } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { FaultSettings } from '../fixtures/faults.fixture.js';
import { startChildApp, type ChildApp } from '../support/child-app.js';
import { CountingDownstream } from '../support/counting-downstream.js';
import type { TestDatabase } from '../support/database.js';
import { createFaultDatabase } from '../support/fault-database.js';
import { expectExactlyOnce, faultReport } from '../support/fault-report.js';
import { startSender } from '../support/retrying-sender.js';

const CHILD_ENTRY = resolve('dist/test/fixtures/faults-child.js');
/** Kills per run; each killed process is replaced by a fresh one (booted before the run). */
const KILLS = 4;
/** A kill comes at a random moment at least this long after the previous one (or the start). */
const KILL_AFTER_MS = { min: 200, max: 900 };
/**
 * Short, so that a dead process's lease expires within the run; the heartbeat keeps a live
 * process's lease, however slow the machine.
 */
const LEASE_MS = 2_000;
/** A real API's latency: a kill can land while a call is in flight. */
const DOWNSTREAM_LATENCY_MS = 30;

/**
 * Two app processes behind the retrying sender, SIGKILLed at random moments (one at a time,
 * each restarted): no shutdown hook, no rollback from the app, in-flight requests cut. Nothing
 * is lost and no database effect is doubled, in either mode. In external mode a process killed
 * between its downstream call and its completion leaves a lease that expires and is re-claimed,
 * so the call is made again: such extra calls are printed and allowed, and only those. A repeated
 * call is told apart by the pid its earlier call carried: it must be a killed process's.
 */
describe('fault: app processes SIGKILLed at random under a retrying sender', () => {
  let db: TestDatabase;
  let downstream: CountingDownstream;
  const started: ChildApp[] = [];

  beforeAll(async () => {
    db = await createFaultDatabase();
    downstream = await CountingDownstream.start({ latencyMs: DOWNSTREAM_LATENCY_MS });
  });

  afterEach(async () => {
    await Promise.all(started.splice(0).map((child) => child.kill()));
  });

  afterAll(async () => {
    await downstream?.close();
    await db?.drop();
  });

  const startChild = async () => {
    const settings: FaultSettings = {
      databaseUrl: db.url,
      downstreamUrl: downstream.url,
      applicationName: 'faults-sigkill',
      idempotency: { leaseMs: LEASE_MS, retryAfterSeconds: 5 },
    };
    const child = await startChildApp('fastify', settings, { entry: CHILD_ENTRY });
    started.push(child);
    return child;
  };
  const alive = (child: ChildApp) => child.process.exitCode === null && child.process.signalCode === null;

  it.each(['transaction', 'external'] as const)(
    '%s mode: nothing lost, nothing doubled; extra downstream calls only after a killed caller',
    async (mode) => {
      // Every process the run will need, booted at once before the traffic: boots take seconds on
      // a busy machine, and each killed process is replaced by a fresh one at once, so that two
      // serve between kills.
      const [first, second, ...replacements] = await Promise.all(
        Array.from({ length: 2 + KILLS }, () => startChild()),
      );
      const slots = [first, second];
      const sender = startSender({
        targets: () => slots.filter(alive).map((child) => child.url),
        path: mode === 'transaction' ? '/orders' : '/external',
        // Traffic lasts until the killer is done (finish()), within these bounds.
        events: 1_000,
        idPrefix: `sigkill_${mode}`,
        eventsPerSecond: 50,
        concurrency: 8,
        deadlineMs: 60_000,
      });

      // The killer: a bounded number of kills, each at a random moment while traffic flows.
      const killedPids = new Set<number>();
      const killTimes: number[] = [];
      for (const replacement of replacements) {
        const wait = KILL_AFTER_MS.min + Math.random() * (KILL_AFTER_MS.max - KILL_AFTER_MS.min);
        await new Promise((done) => setTimeout(done, wait));
        const slot = Math.floor(Math.random() * slots.length);
        killedPids.add(slots[slot].process.pid!);
        killTimes.push(Date.now());
        await slots[slot].kill();
        slots[slot] = replacement;
      }
      // A little more traffic after the last kill, then the sender settles what is under way.
      await new Promise((done) => setTimeout(done, KILL_AFTER_MS.max));
      sender.finish();
      const sent = await sender.result;

      const report = await faultReport({
        fault: `${killedPids.size} SIGKILLs of 2 app processes, each replaced by a fresh one`,
        mode,
        scope: mode === 'transaction' ? 'FaultsController.order' : 'FaultsController.external',
        sent,
        db,
        downstream,
        killedPids,
      });
      expectExactlyOnce(report, { killed: true });
      // The kills came while traffic flowed: events were still being answered after the last one.
      expect(killedPids.size).toBe(KILLS);
      const sends = sent.deliveries.flatMap((delivery) => delivery.sends);
      expect(
        sends.filter((send) => send.status === 200 && send.at > killTimes.at(-1)!).length,
      ).toBeGreaterThan(0);
    },
    120_000,
  );
});
