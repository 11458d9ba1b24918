import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { DataSource } from 'typeorm';
import { pgPoolOf } from '../../lib/postgres/typeorm-internals.js';
import type { RunningApp } from '../support/app.js';
import { CLAIM_SQL } from '../support/claim-sql.js';
import type { CountingDownstream } from '../support/counting-downstream.js';
import type { TestDatabase } from '../support/database.js';
import { startFaultApp, type FaultApp } from '../support/fault-app.js';
import { expectExactlyOnce, faultReport } from '../support/fault-report.js';
import { claimRow } from '../support/lease-rows.js';
import { LogCapture } from '../support/log-capture.js';
import { startSender } from '../support/retrying-sender.js';
import { startTcpProxy, type CutRule, type StatementPredicate, type TcpProxy } from '../support/tcp-proxy.js';
import { waitUntil } from '../support/wait-until.js';

const APPLICATION_NAME = 'faults-cuts';
/** Cuts made per run at most; the run must see at least MIN_CUTS of them. */
const MAX_CUTS = 25;
const MIN_CUTS = 10;
const EXTERNAL = 'FaultsController.external';

/** The COMMIT of a claim's transaction (sent as a simple query). */
const isCommit: StatementPredicate = (sql) => sql === 'COMMIT';
/** A send of the fenced lease completion (prepared as idempotency_lease_complete, or unnamed). */
const isLeaseCompletion: StatementPredicate = (sql) => sql === CLAIM_SQL.leaseComplete.text;

/**
 * The app reaches Postgres through a loopback proxy that cuts a connection right after a
 * statement has gone through and the server has finished with it, before the app hears the
 * answer: an ambiguous COMMIT (transaction mode), a completion that happened unheard (external
 * mode). Again and again during traffic: nothing lost, nothing doubled, no extra downstream call.
 */
describe('fault: connections cut right after COMMIT and after a lease completion', () => {
  let system: FaultApp;
  let db: TestDatabase;
  let proxy: TcpProxy;
  let downstream: CountingDownstream;
  let running: RunningApp;
  const logs = new LogCapture();
  const rules: CutRule[] = [];

  beforeAll(async () => {
    system = await startFaultApp({
      adapter: 'express',
      applicationName: APPLICATION_NAME,
      idempotency: { leaseMs: 5_000, retryAfterSeconds: 5 },
      downstreamLatencyMs: 10,
      appDatabaseUrl: async (database) => {
        const target = new URL(database.url);
        proxy = await startTcpProxy(target.hostname, Number(target.port));
        return proxy.url(database.url);
      },
    });
    ({ db, downstream, running } = system);
    running.app.useLogger(logs);
  });

  afterEach(() => {
    for (const rule of rules.splice(0)) rule.cancel();
  });

  afterAll(async () => {
    await system?.close();
    await proxy?.close();
  });

  /**
   * Keeps one after-forward cut armed until `stop()` or MAX_CUTS: each cut re-arms the next,
   * so cuts land on consecutive matching statements of whatever deliveries are running.
   */
  const cutRepeatedly = (predicate: StatementPredicate) => {
    let stopped = false;
    let made = 0;
    const arm = () => {
      if (stopped || made >= MAX_CUTS) return;
      const rule = proxy.cutWhen(predicate, { when: 'after-forward' });
      rules.push(rule);
      void rule.done.then(() => {
        made++;
        arm();
      });
    };
    arm();
    return {
      stop: () => {
        stopped = true;
        return made;
      },
    };
  };

  it.each([
    ['transaction', 'COMMIT', '/orders', 'FaultsController.order', isCommit],
    ['external', CLAIM_SQL.leaseComplete.name, '/external', EXTERNAL, isLeaseCompletion],
  ] as const)(
    '%s mode: cut after each %s had run; nothing lost, nothing doubled, no extra downstream call',
    async (mode, statement, path, scope, predicate) => {
      const cuts = cutRepeatedly(predicate);
      const sender = startSender({
        targets: () => [running.url],
        path,
        events: 150,
        idPrefix: `cut_${mode}`,
        eventsPerSecond: 75,
        concurrency: 8,
        deadlineMs: 60_000,
      });
      const sent = await sender.result;
      const made = cuts.stop();

      const report = await faultReport({
        fault: `connection cut after ${statement} had run (${made} cuts)`,
        mode,
        scope,
        sent,
        db,
        downstream,
      });
      expectExactlyOnce(report);
      expect(made).toBeGreaterThanOrEqual(MIN_CUTS);
    },
    90_000,
  );

  it('sends a completion again until it lands, however many of its sends are cut, while the lease lasts', async () => {
    const id = 'cut_completion_persists';
    // StatementExecutor.executeResending sends a statement three times: cut one more than that.
    const cuts = [1, 2, 3, 4].map(() => {
      const rule = proxy.cutWhen((sql, sent) => isLeaseCompletion(sql, sent) && sent.parameters[1] === id);
      rules.push(rule);
      return rule;
    });
    logs.clear();
    const answer = await fetch(`${running.url}/external`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id }),
    });
    expect(answer.status).toBe(200);
    expect(cuts.map((rule) => rule.fired)).toEqual([true, true, true, true]);
    // Done before the answer: no lease left to expire, nothing logged as lost.
    expect(await claimRow(db, EXTERNAL, id)).toMatchObject({ status: 'done', attempts: 1 });
    expect(logs.find('error', 'Could not mark')).toEqual([]);
    expect(downstream.callsFor(id)).toHaveLength(1);
  });

  it('takes a session terminated as it starts (ReadyForQuery and FATAL in one read) as a lost connection, not the end of the process', async () => {
    const id = 'cut_session_dies_at_start';
    const pool = pgPoolOf(running.app.get(DataSource));
    // The delivery must open a new session: none is left idle in the app's pool.
    await db.pool.query(
      `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
       WHERE application_name = $1 AND datname = current_database()`,
      [APPLICATION_NAME],
    );
    await waitUntil(() => pool.totalCount === 0, 'the app’s pool to drop its terminated sessions');
    const hold = proxy.holdStartup();
    const answer = fetch(`${running.url}/orders`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id }),
    });
    await db.pool.query('SELECT pg_terminate_backend($1)', [await hold.backendPid]);

    // Without a listener of its own on the new client, pg's 'error' event would have no
    // listener at that moment and end the process (here: fail the test file as an unhandled error).
    const unavailable = await answer;
    expect(unavailable.status).toBe(503);
    expect(unavailable.headers.get('retry-after')).toBe('5');
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(0);
    const redelivered = await fetch(`${running.url}/orders`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id }),
    });
    expect(redelivered.status).toBe(200);
    expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(1);
  });
});
