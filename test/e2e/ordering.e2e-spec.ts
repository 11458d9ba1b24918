import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { PoolClient } from 'pg';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { ExpiredLeaseReporter } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { ClaimDatabase } from '../../lib/postgres/claim-database.js';
import { pgPoolOf } from '../../lib/postgres/typeorm-internals.js';
import {
  ORDERING_SCHEMA,
  OrderingFixtureModule,
  Runs,
  type SnapshotEvent,
} from '../fixtures/ordering.fixture.js';
import { Gates, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { bootFailure } from '../support/boot-failure.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, lockWaiters, type TestDatabase } from '../support/database.js';
import { onEveryRoute, pgBouncerPerFile, routeUrl } from '../support/database-routes.js';
import { waitUntil } from '../support/wait-until.js';

/** The claim scope of OrderingController.apply, also its guard's scope. */
const APPLY = 'OrderingController.apply';

const pooler = pgBouncerPerFile();

/**
 * The ordering guard through real apps on a real PostgreSQL, directly and through PgBouncer in
 * transaction mode: the newest event of an entity wins whatever order they arrive in; an older one
 * is answered 200 `Idempotent-Stale: true`, its claim done, its handler not run; the version check
 * and advance are part of the claim's transaction.
 */
describe.each(onEveryRoute(ADAPTERS))('ordering guard (%s, %s)', (route, adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  const extra: RunningApp[] = [];
  let entities = 0;
  /** A fresh entity per test: the tests share one database. */
  const newEntity = () => `sub_${route}_${adapter}_${++entities}`;

  const start = async (idempotency = {}) =>
    startApp(adapter, [
      OrderingFixtureModule.forDatabase({ databaseUrl: routeUrl(route, db, pooler), idempotency }),
    ]);

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(ORDERING_SCHEMA);
    running = await start();
  });

  afterEach(async () => {
    running.app.get(Gates).openAll();
    for (const app of extra.splice(0)) {
      app.app.get(Gates).openAll();
      await app.close();
    }
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const post = (path: string, event: SnapshotEvent, app = running) =>
    request(app.url).post(`/ordered${path}`).send(event);
  const event = (entity: string, version: unknown, extras: Partial<SnapshotEvent> = {}): SnapshotEvent => ({
    id: `evt_${entity}_${String(version)}_${extras.status ?? 's'}${extras.id ?? ''}`,
    entity,
    version,
    status: `status@${String(version)}`,
    ...extras,
  });
  const snapshot = async (entity: string) =>
    (await db.pool.query('SELECT status, event_id FROM snapshots WHERE entity = $1', [entity])).rows[0];
  const applies = (id: string) => db.count('SELECT count(*) FROM applies WHERE event_id = $1', [id]);
  const claimStatus = async (id: string) =>
    (await db.pool.query('SELECT status FROM processed_events WHERE event_key = $1', [id])).rows.map(
      (row: { status: string }) => row.status,
    );
  const version = async (entity: string, scope = APPLY) =>
    (
      await db.pool.query(
        'SELECT version::text AS version FROM processed_events_versions WHERE scope = $1 AND entity = $2',
        [scope, entity],
      )
    ).rows[0]?.version as string | undefined;
  const outcomes = (app: RunningApp, scope = APPLY) =>
    app.app.get(IdempotencyMetrics).snapshot().claims[scope] ?? {};
  const expectApplied = (answer: request.Response, id: string) => {
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({ applied: id });
    expect(answer.headers['idempotent-stale']).toBeUndefined();
    expect(answer.headers['idempotent-replayed']).toBeUndefined();
  };
  const expectStale = (answer: request.Response) => {
    expect(answer.status).toBe(200);
    expect(answer.headers['idempotent-stale']).toBe('true');
    expect(answer.headers['idempotent-replayed']).toBeUndefined();
  };

  it('checks the key as well: a key reused with another body is replayed and counted, its version left', async () => {
    const entity = newEntity();
    const first = event(entity, 100);
    expectApplied(await post('', first), first.id);
    const fingerprint = async () =>
      (await db.pool.query('SELECT fingerprint FROM processed_events WHERE event_key = $1', [first.id]))
        .rows[0].fingerprint as string | null;
    const stored = await fingerprint();
    expect(stored).toEqual(expect.any(String));
    const before = outcomes(running).key_conflict ?? 0;
    // The same id with a newer version and another status: another event under a reused key.
    const reused = await post('', { ...first, version: 200, status: 'other' });
    expect(reused.status).toBe(200);
    expect(reused.headers['idempotent-replayed']).toBe('true');
    expect(running.app.get(Runs).of('apply', first.id)).toBe(1);
    expect(await applies(first.id)).toBe(1);
    expect(await snapshot(entity)).toEqual({ status: first.status, event_id: first.id });
    // A replay writes no version: the entity keeps the one its applied event set.
    expect(await version(entity)).toBe('100');
    expect(await fingerprint()).toBe(stored);
    expect((outcomes(running).key_conflict ?? 0) - before).toBe(1);
  });

  it('keeps the newest event: an older one delivered later is stale, done, not run, counted', async () => {
    const entity = newEntity();
    const [v1, v2, v3] = [event(entity, 100), event(entity, 200), event(entity, 300)];
    const before = outcomes(running);
    expectApplied(await post('', v2), v2.id);
    const stale = await post('', v1);
    expectStale(stale);
    // Nothing from a handler that did not run.
    expect(stale.text).toBe('');
    expect(running.app.get(Runs).of('apply', v1.id)).toBe(0);
    expect(await applies(v1.id)).toBe(0);
    expect(await claimStatus(v1.id)).toEqual(['done']);
    expect(await snapshot(entity)).toEqual({ status: v2.status, event_id: v2.id });
    expect(await version(entity)).toBe('200');

    // Its redelivery is a replay (the claim is done), stale or not.
    const replayed = await post('', v1);
    expect(replayed.status).toBe(200);
    expect(replayed.headers['idempotent-replayed']).toBe('true');
    expect(replayed.headers['idempotent-stale']).toBeUndefined();

    expectApplied(await post('', v3), v3.id);
    expect(await snapshot(entity)).toEqual({ status: v3.status, event_id: v3.id });
    expect(await version(entity)).toBe('300');
    const after = outcomes(running);
    expect((after.claimed ?? 0) - (before.claimed ?? 0)).toBe(2);
    expect((after.stale ?? 0) - (before.stale ?? 0)).toBe(1);
    expect((after.replayed ?? 0) - (before.replayed ?? 0)).toBe(1);
  });

  it('applies an equal version by default (the later delivery wins), and calls it stale with equalVersions: stale', async () => {
    const entity = newEntity();
    const first = event(entity, 500, { status: 'first' });
    const second = event(entity, 500, { status: 'second' });
    expectApplied(await post('', first), first.id);
    expectApplied(await post('', second), second.id);
    expect(await snapshot(entity)).toEqual({ status: 'second', event_id: second.id });

    const strict = newEntity();
    const a = event(strict, 500, { status: 'first' });
    const b = event(strict, 500, { status: 'second' });
    expectApplied(await post('/strict', a), a.id);
    expectStale(await post('/strict', b));
    expect(await snapshot(strict)).toEqual({ status: 'first', event_id: a.id });
    expect(await applies(b.id)).toBe(0);
  });

  it('compares versions as numbers, exactly: decimals and integers past 2^53', async () => {
    const entity = newEntity();
    // As text '10' < '9'; as numbers, 9 < 10. Fractions beyond a double's precision still count.
    expectApplied(
      await post('', event(entity, '9.000000000000000001')),
      event(entity, '9.000000000000000001').id,
    );
    expectApplied(await post('', event(entity, 10)), event(entity, 10).id);
    expectStale(await post('', event(entity, '9.999999999999999999999')));
    expect(await version(entity)).toBe('10');
    const big = newEntity();
    expectApplied(await post('', event(big, '9007199254740993')), event(big, '9007199254740993').id);
    expectStale(await post('', event(big, '9007199254740992')));
    expect(await version(big)).toBe('9007199254740993');
  });

  it('runStale: the handler runs with context.stale, the answer is marked stale, the version stays', async () => {
    const entity = newEntity();
    const [older, newer] = [event(entity, 1), event(entity, 2)];
    expectApplied(await post('/run-stale', newer), newer.id);
    const stale = await post('/run-stale', older);
    expectStale(stale);
    expect(stale.body).toEqual({ recorded: older.id, stale: true });
    expect(running.app.get(Runs).of('run-stale', older.id)).toBe(1);
    expect((await db.pool.query('SELECT stale FROM applies WHERE event_id = $1', [older.id])).rows).toEqual([
      { stale: true },
    ]);
    expect(await snapshot(entity)).toEqual({ status: newer.status, event_id: newer.id });
    expect(await version(entity, 'OrderingController.runStale')).toBe('2');
    expect(outcomes(running, 'OrderingController.runStale')).toMatchObject({ claimed: 1, stale: 1 });
  });

  it('gives the handler its own lock_timeout back after the ordered claim, stale or not', async () => {
    const entity = newEntity();
    const fresh = await post('/settings', event(entity, 2));
    expect(fresh.body).toEqual({ lockTimeout: '0', stale: false });
    const stale = await post('/settings', event(entity, 1));
    expect(stale.body).toEqual({ lockTimeout: '0', stale: true });
  });

  it('advances nothing when the handler fails: the version is rolled back with the claim', async () => {
    const entity = newEntity();
    const [v1, v5] = [event(entity, 1), event(entity, 5, { fail: true })];
    expect((await post('', v5)).status).toBe(500);
    expect(await version(entity)).toBeUndefined();
    expect(await snapshot(entity)).toBeUndefined();
    expect(await claimStatus(v5.id)).toEqual(['failed']);
    // The older event is not stale: the failed newer one applied nothing.
    expectApplied(await post('', v1), v1.id);
    expect(await version(entity)).toBe('1');
    // The failed event's redelivery is taken back (its row is failed) and checked: newer, applied.
    expectApplied(await post('', { ...v5, fail: false }), v5.id);
    expect(await version(entity)).toBe('5');
    expect(await claimStatus(v5.id)).toEqual(['done']);
  });

  it('leaves an event whose entity is null unordered: processed, no version written', async () => {
    const id = `evt_unordered_${route}_${adapter}`;
    const answer = await post('', { id, entity: null, version: 'not even a version', status: 'x' });
    expect(answer.status).toBe(200);
    expect(answer.headers['idempotent-stale']).toBeUndefined();
    expect(await db.count('SELECT count(*) FROM processed_events_versions WHERE entity = $1', ['null'])).toBe(
      0,
    );
    expect(await claimStatus(id)).toEqual(['done']);
  });

  it.each([
    [
      'an entity that is not a string',
      { entity: { id: 1 } },
      'Event entity of OrderingController.apply is an object',
    ],
    ['an empty entity', { entity: '' }, 'Event entity of OrderingController.apply is empty'],
    [
      'a version that is text',
      { version: 'yesterday' },
      'Event version of OrderingController.apply is the string "yesterday"',
    ],
    ['a missing version', { version: undefined }, 'Event version of OrderingController.apply is undefined'],
    ['an exponent', { version: '1e5' }, 'Event version of OrderingController.apply is the string "1e5"'],
  ])('answers %s 400, naming it, and writes no row', async (_label, change, message) => {
    const id = `evt_bad_${route}_${adapter}_${_label.replace(/\W/g, '')}`;
    const answer = await post('', { ...event(newEntity(), 1), ...change, id } as SnapshotEvent);
    expect(answer.status).toBe(400);
    expect(answer.body.message).toContain(message);
    expect(await claimStatus(id)).toEqual([]);
    expect(await applies(id)).toBe(0);
  });

  it('shares versions between handlers of one order scope', async () => {
    const entity = newEntity();
    expectApplied(await post('/shared-a', event(entity, 2)), event(entity, 2).id);
    expectStale(await post('/shared-b', event(entity, 1)));
    expect(await version(entity, 'shared')).toBe('2');
  });

  it('serialises two events of one entity at two replicas: the second waits, then sees the first version', async () => {
    const replica = await start();
    extra.push(replica);
    const entity = newEntity();
    const [older, newer] = [event(entity, 10), event(entity, 20, { block: true })];
    const first = post('', newer).then((answer) => answer);
    await running.app.get(Gates).entered(newer.id);
    const second = post('', older, replica).then((answer) => answer);
    // The older event's claim waits on the entity's row, held by the open newer one.
    await waitUntil(async () => (await lockWaiters(db)) === 1, 'the second event to wait on the entity');
    running.app.get(Gates).open(newer.id);
    expectApplied(await first, newer.id);
    expectStale(await second);
    expect(await snapshot(entity)).toEqual({ status: newer.status, event_id: newer.id });
    expect(await applies(older.id)).toBe(0);
  });

  it('hands the waiting event the rollback when the first one fails: it applies', async () => {
    const replica = await start();
    extra.push(replica);
    const entity = newEntity();
    const [older, newer] = [event(entity, 10), event(entity, 20, { block: true, fail: true })];
    const first = post('', newer).then((answer) => answer);
    await running.app.get(Gates).entered(newer.id);
    const second = post('', older, replica).then((answer) => answer);
    await waitUntil(async () => (await lockWaiters(db)) === 1, 'the second event to wait on the entity');
    running.app.get(Gates).open(newer.id);
    expect((await first).status).toBe(500);
    expectApplied(await second, older.id);
    expect(await version(entity)).toBe('10');
  });

  it('bounds the wait as a duplicate is: 409 + Retry-After after concurrentDuplicateWaitMs, nothing written', async () => {
    const replica = await start({ concurrentDuplicateWaitMs: 300 });
    extra.push(replica);
    const entity = newEntity();
    const [older, newer] = [event(entity, 10), event(entity, 20, { block: true })];
    const first = post('', newer).then((answer) => answer);
    await running.app.get(Gates).entered(newer.id);
    const second = await post('', older, replica);
    expect(second.status).toBe(409);
    expect(Number(second.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(await claimStatus(older.id)).toEqual([]);
    running.app.get(Gates).open(newer.id);
    expectApplied(await first, newer.id);
    // Delivered again, it finds the newer version committed.
    expectStale(await post('', older, replica));
  });

  it('removes versions with the claims they ordered (retention), so an entity starts over', async () => {
    const entity = newEntity();
    const kept = newEntity();
    expectApplied(await post('', event(entity, 7)), event(entity, 7).id);
    expectApplied(await post('', event(kept, 7)), event(kept, 7).id);
    // As if applied 40 days ago, with the claim that applied it.
    await db.pool.query(
      `UPDATE processed_events_versions SET applied_at = now() - interval '40 days' WHERE entity = $1`,
      [entity],
    );
    const report = await running.app.get(ExpiredLeaseReporter).run({ force: true });
    expect(report.deletedVersions).toBeGreaterThanOrEqual(1);
    expect(await version(entity)).toBeUndefined();
    expect(await version(kept)).toBe('7');
  });
});

/** What one pg connection was sent, from now on. */
function recordQueries(client: PoolClient): string[] {
  const sent: string[] = [];
  const target = client as unknown as { query: (...args: unknown[]) => unknown };
  const query = target.query.bind(client);
  target.query = (config: unknown, ...rest: unknown[]) => {
    sent.push(typeof config === 'string' ? config : String((config as { text?: string }).text));
    return query(config, ...rest);
  };
  return sent;
}

describe.each(ADAPTERS)('ordering guard on the wire (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(ORDERING_SCHEMA);
    running = await startApp(adapter, [
      OrderingFixtureModule.forDatabase({ databaseUrl: db.url, poolSize: 1 }),
    ]);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  it('costs no round trip: the version check travels in the claim query, the COMMIT alone', async () => {
    const pool = pgPoolOf(running.app.get(DataSource));
    const client = await pool.connect();
    client.release();
    const sent = recordQueries(client);
    // A webhook has key checks by default: its ordered claim is the checked one (the fingerprint
    // stored with the claim), still one statement.
    const { checkedOrdered: ordered } = running.app.get(ClaimDatabase);
    const deliver = async (path: string, id: string, version: number) => {
      sent.length = 0;
      const answer = await request(running.url)
        .post(`/ordered${path}`)
        .send({ id, entity: `wire_${adapter}`, version, status: 's' });
      expect(answer.status).toBe(200);
      return [...sent];
    };
    const unordered = await deliver('/unordered', `evt_wire_u_${adapter}`, 1);
    const first = await deliver('', `evt_wire_1_${adapter}`, 2);
    const second = await deliver('', `evt_wire_2_${adapter}`, 3);
    const stale = await deliver('', `evt_wire_0_${adapter}`, 1);
    // Round trips: the claim query, the handler's two statements, the COMMIT.
    expect(first).toHaveLength(unordered.length);
    expect(second).toHaveLength(unordered.length);
    // Its companion first (the response's store, ClaimStatement.companions), then itself.
    expect(first[0]).toMatch(
      new RegExp(
        `^BEGIN; PREPARE ${ordered.applyEqual.companions![0].name} AS .*; PREPARE ${ordered.applyEqual.name} .*; EXECUTE ${ordered.applyEqual.name} \\(`,
        's',
      ),
    );
    expect(second[0]).toMatch(new RegExp(`^BEGIN; EXECUTE ${ordered.applyEqual.name} \\(`));
    expect(first.at(-1)).toBe('COMMIT');
    // A stale event: the claim query and the COMMIT, no handler statement.
    expect(stale).toEqual([
      expect.stringMatching(`^BEGIN; EXECUTE ${ordered.applyEqual.name} \\(`),
      'COMMIT',
    ]);
  });
});

describe('ordering guard at boot', () => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(ORDERING_SCHEMA);
    // A database migrated before the versions table existed.
    await db.pool.query('DROP TABLE processed_events_versions');
  });

  afterAll(async () => {
    await db?.drop();
  });

  it('fails the boot naming the handlers with a guard when the versions table is missing', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [OrderingFixtureModule.forDatabase({ databaseUrl: db.url })],
    }).compile();
    const failure = await bootFailure(moduleRef.createNestApplication({ logger: false }));
    expect(failure.message).toContain(
      'IdempotencyModule cannot start: OrderingController.apply, OrderingController.strict, OrderingController.runStale, OrderingController.sharedA, OrderingController.sharedB, OrderingController.settings have an ordering guard (order), but its versions table "processed_events_versions" does not exist. Run the library\'s migrations',
    );
  });

  it('boots an app without a guard, whose retention skips the missing table', async () => {
    const running = await startApp('express', [WebhookFixtureModule.forDatabase({ databaseUrl: db.url })]);
    try {
      const answer = await request(running.url).post('/orders').send({ id: 'evt_boot_plain' });
      expect(answer.status).toBe(200);
      const report = await running.app.get(ExpiredLeaseReporter).run({ force: true });
      expect(report.deletedVersions).toBe(0);
    } finally {
      await running.close();
    }
  });
});
