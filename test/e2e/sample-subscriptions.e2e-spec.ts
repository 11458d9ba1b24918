import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { pgBouncerPerFile, routeUrl, ROUTES } from '../support/database-routes.js';
import { killAllSamples, startSample, type SampleProcess } from '../support/sample-process.js';
import { deliver, stripeEvent, subscriptionEvent, SUBSCRIPTIONS } from '../support/sample-stripe.js';

/** PgBouncer in transaction mode in front of the run's PostgreSQL, for the `pgbouncer` route. */
const pooler = pgBouncerPerFile();

/** Sends of one delivery at most: a 409 (the subscription held by another delivery) is sent again. */
const MAX_SENDS = 20;

/** A seeded PRNG: the same seed, the same order. */
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

/**
 * The sample's `POST /webhooks/stripe/subscriptions` as Stripe uses it: signed
 * `customer.subscription.*` events of one subscription, delivered in any order, with retries and
 * concurrent copies. The `subscriptions` row ends as the newest event has it; older ones are
 * answered 200 `Idempotent-Stale: true` and apply nothing. Directly and through PgBouncer.
 */
describe.each(ROUTES)('Stripe sample: subscriptions in any order (%s)', (route) => {
  let db: TestDatabase;
  let sample: SampleProcess;

  beforeAll(async () => {
    db = await createTestDatabase(undefined, { fixtureSchema: false });
    sample = await startSample({ databaseUrl: routeUrl(route, db, pooler) });
  });

  afterAll(async () => {
    await killAllSamples();
    await db?.drop();
  });

  const row = async (id: string) =>
    (await db.pool.query('SELECT status, event_id FROM subscriptions WHERE id = $1', [id])).rows;
  const claims = async (prefix: string) =>
    (
      await db.pool.query<{ event_key: string; status: string }>(
        `SELECT event_key, status FROM processed_events WHERE scope = 'stripe.subscriptions' AND event_key LIKE $1`,
        [`${prefix}%`],
      )
    ).rows;
  /** One delivery, sent again while the subscription is held elsewhere (409 + Retry-After). */
  const deliverUntilAnswered = async (body: Record<string, unknown>) => {
    for (let sends = 1; ; sends++) {
      const answer = await deliver(sample.url, SUBSCRIPTIONS, body);
      if (answer.status !== 409 || sends >= MAX_SENDS) return answer;
    }
  };

  it.each([1, 2, 3])(
    'ends in the newest event’s state whatever the order, with duplicates and concurrent copies (order %i)',
    async (seed) => {
      const random = mulberry32(seed);
      const sub = `sub_${route}_${seed}`;
      const t0 = 1_718_000_000;
      const events = [
        subscriptionEvent(`evt_${sub}_0`, 'created', sub, 'incomplete', t0),
        subscriptionEvent(`evt_${sub}_1`, 'updated', sub, 'trialing', t0 + 1),
        subscriptionEvent(`evt_${sub}_2`, 'updated', sub, 'active', t0 + 5),
        subscriptionEvent(`evt_${sub}_3`, 'updated', sub, 'past_due', t0 + 9),
        subscriptionEvent(`evt_${sub}_4`, 'updated', sub, 'active', t0 + 12),
        subscriptionEvent(`evt_${sub}_5`, 'deleted', sub, 'canceled', t0 + 20),
      ];
      // Every event, then half of them again, shuffled; deliveries go in waves of 1 to 3 at once.
      const order = [...events, ...events.filter(() => random() < 0.5)];
      for (let i = order.length - 1; i > 0; i--) {
        const j = Math.floor(random() * (i + 1));
        [order[i], order[j]] = [order[j], order[i]];
      }
      const answers: { id: string; stale: boolean; replayed: boolean }[] = [];
      for (let at = 0; at < order.length;) {
        const wave = order.slice(at, at + 1 + Math.floor(random() * 3));
        at += wave.length;
        const answered = await Promise.all(wave.map((event) => deliverUntilAnswered(event)));
        answered.forEach((answer, i) => {
          expect({ id: wave[i].id, status: answer.status }).toEqual({ id: wave[i].id, status: 200 });
          answers.push({
            id: wave[i].id,
            stale: answer.headers['idempotent-stale'] === 'true',
            replayed: answer.headers['idempotent-replayed'] === 'true',
          });
        });
      }
      // The newest is `.deleted`: the row stays, canceled, written by that event.
      expect(await row(sub)).toEqual([{ status: 'canceled', event_id: `evt_${sub}_5` }]);
      expect((await claims(`evt_${sub}_`)).map((claim) => claim.status)).toEqual(events.map(() => 'done'));
      // Each event was decided once: applied, or stale; the newest never stale.
      for (const event of events) {
        const deciding = answers.filter((answer) => answer.id === event.id && !answer.replayed);
        expect({ id: event.id, deciding: deciding.length }).toEqual({ id: event.id, deciding: 1 });
      }
      expect(answers.find((answer) => answer.id === `evt_${sub}_5` && !answer.replayed)?.stale).toBe(false);
      const { rows: version } = await db.pool.query(
        `SELECT version::text AS version FROM processed_events_versions WHERE scope = 'stripe.subscriptions' AND entity = $1`,
        [sub],
      );
      expect(version).toEqual([{ version: String(t0 + 20) }]);
    },
  );

  it('answers an older event 200 Idempotent-Stale: true and applies nothing; .deleted keeps the row canceled', async () => {
    const sub = `sub_${route}_late`;
    const updated = await deliver(
      sample.url,
      SUBSCRIPTIONS,
      subscriptionEvent(`evt_${sub}_updated`, 'updated', sub, 'active', 1_718_000_100),
    );
    expect(updated.status).toBe(200);
    expect(updated.body).toMatchObject({ eventId: `evt_${sub}_updated`, effect: 'subscription_active' });
    // The .created, made before it, arrives after it.
    const created = await deliver(
      sample.url,
      SUBSCRIPTIONS,
      subscriptionEvent(`evt_${sub}_created`, 'created', sub, 'incomplete', 1_718_000_050),
    );
    expect(created.status).toBe(200);
    expect(created.headers['idempotent-stale']).toBe('true');
    expect(await row(sub)).toEqual([{ status: 'active', event_id: `evt_${sub}_updated` }]);

    const deleted = await deliver(
      sample.url,
      SUBSCRIPTIONS,
      subscriptionEvent(`evt_${sub}_deleted`, 'deleted', sub, 'canceled', 1_718_000_200),
    );
    expect(deleted.body).toMatchObject({ effect: 'subscription_canceled' });
    // An .updated from before the cancellation, retried late: a cancelled subscription stays cancelled.
    const late = await deliver(
      sample.url,
      SUBSCRIPTIONS,
      subscriptionEvent(`evt_${sub}_late`, 'updated', sub, 'active', 1_718_000_150),
    );
    expect(late.headers['idempotent-stale']).toBe('true');
    expect(await row(sub)).toEqual([{ status: 'canceled', event_id: `evt_${sub}_deleted` }]);
  });

  it('answers other event types 200 ignored, without ordering them', async () => {
    const sub = `sub_${route}_other`;
    // An .updated applied, then a type the endpoint does not apply, newer than the .updated after it.
    const trial = await deliver(
      sample.url,
      SUBSCRIPTIONS,
      subscriptionEvent(`evt_${sub}_trial`, 'updated', sub, 'trialing', 1_718_000_900),
    );
    expect(trial.status).toBe(200);
    const ignored = await deliver(sample.url, SUBSCRIPTIONS, {
      ...stripeEvent(`evt_${sub}_will_end`, 'customer.subscription.trial_will_end', {
        id: sub,
        status: 'trialing',
      }),
      created: 1_718_001_000,
    });
    expect(ignored.status).toBe(200);
    expect(ignored.body).toMatchObject({ effect: 'ignored' });
    expect(ignored.headers['idempotent-stale']).toBeUndefined();
    // Had the ignored event advanced the version, this one (older than it) would be stale.
    const updated = await deliver(
      sample.url,
      SUBSCRIPTIONS,
      subscriptionEvent(`evt_${sub}_active`, 'updated', sub, 'active', 1_718_000_950),
    );
    expect(updated.headers['idempotent-stale']).toBeUndefined();
    expect(await row(sub)).toEqual([{ status: 'active', event_id: `evt_${sub}_active` }]);
  });

  it('refuses a subscription event without created: 400 naming it, nothing written', async () => {
    const sub = `sub_${route}_nocreated`;
    const event = subscriptionEvent(`evt_${sub}`, 'updated', sub, 'active', 1);
    delete event.created;
    const answer = await deliver(sample.url, SUBSCRIPTIONS, event);
    expect(answer.status).toBe(400);
    expect(answer.body.message).toContain('Event version of stripe.subscriptions is undefined');
    expect(await claims(`evt_${sub}`)).toEqual([]);
    expect(await row(sub)).toEqual([]);
  });
});
