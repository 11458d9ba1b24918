import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { resolve } from 'node:path';
import { ORDERING_SCHEMA, type SnapshotEvent } from '../fixtures/ordering.fixture.js';
import { ADAPTERS } from '../support/app.js';
import { startChildApp, type ChildApp } from '../support/child-app.js';
import { createTestDatabase, lockWaiters, type TestDatabase } from '../support/database.js';
import { waitUntil, within } from '../support/wait-until.js';

const CHILD = resolve('dist/test/fixtures/ordering-child.js');

/** Events of the one entity, and how many deliveries they get in all (with duplicates and copies). */
const EVENTS = 14;
/** Deliveries in flight at once, across both processes. */
const IN_FLIGHT = 6;
/** Sends of one delivery at most, and the time all of them may take: a sender's bounds. */
const MAX_SENDS = 40;
const DEADLINE_MS = 90_000;
/** Retry-After is honoured a hundred times faster, within these bounds (a test cannot wait 30 s). */
const RETRY_MS = { min: 20, max: 200 };
/** A delivery's own timeout. */
const SEND_TIMEOUT_MS = 15_000;

/** A seeded PRNG: the same seed, the same plan. */
function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** One delivery of the plan: an event, the process it goes to first, and whether it parks there. */
interface Delivery {
  event: SnapshotEvent;
  target: 'a' | 'b';
  park?: boolean;
}

/** How one delivery ended: its last answer and every status it got on the way. */
interface Ended {
  id: string;
  status: number;
  stale: boolean;
  replayed: boolean;
  statuses: number[];
}

/**
 * One entity's events delivered out of order to two app processes sharing the database, as two
 * replicas behind a load balancer: shuffled, a third of them again later, some as copies sent to
 * both processes at once. One process is SIGKILLed mid-run while a delivery is parked inside its
 * transaction holding the entity (the other events wait on it); every delivery is sent again, to
 * the survivor, until it is answered 200. The entity must end in its newest event's state, every
 * event's claim done, and the handler committed once per event that was not stale, in version
 * order, never for a stale one.
 */
describe.each(ADAPTERS)('ordering guard across two processes with a SIGKILL (%s)', (adapter) => {
  let db: TestDatabase;
  const children: ChildApp[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(ORDERING_SCHEMA);
  });

  afterEach(async () => {
    await Promise.all(children.splice(0).map((child) => child.stop()));
  });

  afterAll(async () => {
    await db?.drop();
  });

  it.each([0x51, 0x7e])(
    'ends in the newest state, every claim done, the handler once per event not stale (seed %i)',
    async (seed) => {
      const random = mulberry32(seed);
      const a = await startChildApp(adapter, { databaseUrl: db.url }, { entry: CHILD });
      const b = await startChildApp(adapter, { databaseUrl: db.url }, { entry: CHILD });
      children.push(a, b);
      const entity = `sub_crash_${adapter}_${seed}`;
      // Distinct versions in a random order of ids, so "newest" is well defined.
      const versions = Array.from({ length: EVENTS }, (_, i) => 1_700_000_000 + i * 7);
      const events: SnapshotEvent[] = versions.map((version, i) => ({
        id: `evt_${entity}_${i}`,
        entity,
        version,
        status: `status-${i}`,
      }));
      const newest = events.at(-1)!;

      // Every event once, shuffled; a third again (later, or at once to the other process).
      const plan: Delivery[] = events.map((event) => ({ event, target: random() < 0.5 ? 'a' : 'b' }));
      for (let i = plan.length - 1; i > 0; i--) {
        const j = Math.floor(random() * (i + 1));
        [plan[i], plan[j]] = [plan[j], plan[i]];
      }
      for (const event of events.filter(() => random() < 0.34)) {
        const at = Math.floor(random() * (plan.length + 1));
        plan.splice(at, 0, { event, target: 'a' }, { event, target: 'b' });
      }
      // The newest event's first delivery parks in process a, a third of the way in, holding the
      // entity (never stale, being the newest); its copies come after it.
      const parkedAt = Math.floor(plan.length / 3);
      const others = plan.filter((delivery) => delivery.event !== newest);
      const copies = plan.filter((delivery) => delivery.event === newest).length;
      others.splice(parkedAt, 0, { event: newest, target: 'a', park: true });
      for (let c = 1; c < copies; c++) {
        const at = parkedAt + 1 + Math.floor(random() * (others.length - parkedAt));
        others.splice(at, 0, { event: newest, target: random() < 0.5 ? 'a' : 'b' });
      }
      const deliveries = others;

      let aAlive = true;
      // The parked delivery asks to park until it has: its first send can wait on the entity
      // behind another event's transaction and be answered 409/503 before reaching its handler.
      let parked = false;
      const hasParked = a.entered(newest.id).then(() => (parked = true));
      const started = Date.now();
      const send = async (delivery: Delivery): Promise<Ended> => {
        const statuses: number[] = [];
        for (let sends = 0; sends < MAX_SENDS && Date.now() - started < DEADLINE_MS; sends++) {
          const child = delivery.target === 'a' && aAlive ? a : b;
          const park = delivery.park === true && child === a && !parked;
          let status = 0;
          let retryAfter: string | null = null;
          let stale = false;
          let replayed = false;
          try {
            const response = await fetch(`${child.url}/ordered`, {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify(park ? { ...delivery.event, block: true } : delivery.event),
              signal: AbortSignal.timeout(park ? DEADLINE_MS : SEND_TIMEOUT_MS),
            });
            await response.arrayBuffer();
            status = response.status;
            retryAfter = response.headers.get('retry-after');
            stale = response.headers.get('idempotent-stale') === 'true';
            replayed = response.headers.get('idempotent-replayed') === 'true';
          } catch {
            // The process is gone (SIGKILL) or the send timed out: deliver again.
          }
          statuses.push(status);
          if (status === 200) return { id: delivery.event.id, status, stale, replayed, statuses };
          // Only "later" is an expected answer here: a refusal or a 500 is a bug.
          if (status !== 0 && status !== 409 && status !== 503) break;
          const ms = Math.min(RETRY_MS.max, Math.max(RETRY_MS.min, (Number(retryAfter ?? 1) * 1000) / 100));
          await new Promise((done) => setTimeout(done, ms * (0.75 + random() * 0.5)));
        }
        return {
          id: delivery.event.id,
          status: statuses.at(-1) ?? 0,
          stale: false,
          replayed: false,
          statuses,
        };
      };

      let next = 0;
      const ended: Ended[] = [];
      const worker = async () => {
        while (next < deliveries.length) {
          const index = next++;
          // What comes after the parked delivery waits until it has parked: a copy of the newest
          // event sent beside it could claim first, and the parked one would be answered a replay.
          if (index > parkedAt) await hasParked;
          ended.push(await send(deliveries[index]));
        }
      };
      const workers = Promise.all(Array.from({ length: IN_FLIGHT }, worker));

      // Mid-run: the parked delivery holds the entity in a, others wait on it; then a dies.
      await within(hasParked, 60_000, 'the newest event to park in process a');
      await waitUntil(async () => (await lockWaiters(db)) >= 1, 'other events to wait on the entity');
      await a.kill();
      aAlive = false;
      await workers;

      const unsettled = ended.filter((end) => end.status !== 200);
      expect(unsettled).toEqual([]);
      expect(ended).toHaveLength(deliveries.length);
      // The kill lost answers (status 0); nothing else asked to be sent again but 409/503.
      expect(ended.flatMap((end) => end.statuses).filter((s) => ![0, 200, 409, 503].includes(s))).toEqual([]);
      expect(ended.some((end) => end.statuses.includes(0))).toBe(true);

      const { rows: state } = await db.pool.query(
        'SELECT status, event_id FROM snapshots WHERE entity = $1',
        [entity],
      );
      expect(state).toEqual([{ status: newest.status, event_id: newest.id }]);
      const { rows: claims } = await db.pool.query<{ event_key: string; status: string }>(
        `SELECT event_key, status FROM processed_events WHERE event_key LIKE $1`,
        [`evt_${entity}\\_%`],
      );
      expect(claims.map((claim) => `${claim.event_key}:${claim.status}`).sort()).toEqual(
        events.map((event) => `${event.id}:done`).sort(),
      );
      const { rows: runs } = await db.pool.query<{ event_id: string }>(
        'SELECT event_id FROM applies WHERE event_id LIKE $1 ORDER BY id',
        [`evt_${entity}\\_%`],
      );
      const applied = runs.map((run) => run.event_id);
      // At most once per event, in increasing version order, the newest last.
      expect(applied).toEqual([...new Set(applied)]);
      const order = applied.map((id) => events.findIndex((event) => event.id === id));
      expect(order).toEqual([...order].sort((x, y) => x - y));
      expect(applied.at(-1)).toBe(newest.id);
      // An event answered stale never committed a run; one answered applied did, once.
      for (const end of ended.filter((e) => !e.replayed)) {
        expect({ id: end.id, committed: applied.includes(end.id) }).toEqual({
          id: end.id,
          committed: !end.stale,
        });
      }
      // Not vacuous: some events were stale, and the kill rolled the parked one back (it ran again in b).
      expect(ended.some((end) => end.stale)).toBe(true);
      expect(b.output()).not.toMatch(/ERROR/);
    },
    180_000,
  );
});
