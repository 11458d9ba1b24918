import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { DataSource } from 'typeorm';
import * as errorsEntry from '../../lib/errors/index.js';
import * as publicApi from '../../lib/index.js';
import { IdempotencyService, type ClaimOutcome, type IdempotentDelivery } from '../../lib/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import * as errors from '../../lib/idempotency.errors.js';
import { expireLease } from '../../lib/testing/index.js';
import {
  INNER_SCOPE,
  METHOD_SCOPE,
  NESTED_QUEUE,
  NESTED_SCHEMA,
  NEVER_METHOD_SCOPE,
  NestedFixtureModule,
  NestedRecorder,
  OUTER_EXTERNAL_SCOPE,
  OUTER_SCOPE,
  type NestedAnswer,
  type NestedEvent,
} from '../fixtures/nested-claims.fixture.js';
import { Gates } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow } from '../support/lease-rows.js';
import { LogCapture } from '../support/log-capture.js';
import { waitUntil, within } from '../support/wait-until.js';

/** Read from the errors module: the package's entry point does not export it (see the last test). */
const { PropagationError } = errors;
/** Short, so a claim held by another transaction is answered in flight quickly. */
const DUPLICATE_WAIT_MS = 300;
/** The most an in-flight answer may tell a sender to wait (the estimate is at most this). */
const RETRY_AFTER_SECONDS = 7;
/** Two connections: a delivery whose inner claim needs a second one deadlocks the pool. */
const POOL_SIZE = 2;
/** pg-boss's schema for the handoff app. */
const JOB_SCHEMA = 'nested_jobs';

/** The messages PropagationError carries (lib/core/idempotency.service.ts), written out. */
const refusals = {
  leaseCannotJoin: (scope: string, enclosing: string) =>
    `${scope} runs in external mode and was called inside ${enclosing}, a transaction-mode ` +
    `delivery: a lease cannot join that transaction (it must commit at once, so that a duplicate ` +
    `sees it). Give ${scope} propagation: 'requiresNew' to claim on a connection of its own (each ` +
    `such delivery then holds two pool connections), or call it outside the transaction.`,
  mandatoryInsideExternal: (scope: string, enclosing: string) =>
    `${scope} has propagation 'mandatory' and must join a transaction-mode delivery, but was called ` +
    `inside ${enclosing}, an external-mode delivery, which holds no transaction.`,
  mandatoryOutside: (scope: string) =>
    `${scope} has propagation 'mandatory' and must join a transaction-mode delivery, but was called ` +
    `outside any delivery.`,
  never: (scope: string, enclosing: string) =>
    `${scope} has propagation 'never' and was called inside the delivery of ${enclosing}.`,
};

/**
 * Claims made while another delivery runs (finding 3 of issue 16, and propagation): a claim inside
 * a transaction-mode delivery used to take a second pool connection and commit on its own, so a
 * pool of N deadlocked under N concurrent nested deliveries, and an outer rollback left the inner
 * claim done while the writes it made through the outer's manager were gone (a redelivery then
 * replayed it: 1 outer row, 0 inner rows). Now it joins the enclosing transaction in a savepoint
 * unless its propagation says otherwise; afterCommit() runs only once its claim is committed.
 */
describe.each(onAdapter('express'))('claims made inside a delivery (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let service: IdempotencyService;
  let recorder: NestedRecorder;
  const logs = new LogCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(NESTED_SCHEMA);
    running = await startApp(adapter, [
      NestedFixtureModule.forSettings({
        databaseUrl: db.url,
        poolSize: POOL_SIZE,
        idempotency: { concurrentDuplicateWaitMs: DUPLICATE_WAIT_MS, retryAfterSeconds: RETRY_AFTER_SECONDS },
      }),
    ]);
    running.app.useLogger(logs);
    service = running.app.get(IdempotencyService);
    recorder = running.app.get(NestedRecorder);
  });

  // A failed assertion must not leave a handler parked: its app could not close.
  afterEach(() => {
    running?.app.get(Gates).openAll();
    logs.clear();
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const post = (path: string, body: NestedEvent) =>
    request(running.url)
      .post(path)
      .send(body)
      .then((answer) => answer);
  const outer = (body: NestedEvent) => post('/nested/outer', body);
  /** Effect rows of `id` by writer. */
  const effects = async (id: string) => {
    const { rows } = await db.pool.query<{ writer: string; n: number }>(
      'SELECT writer, count(*)::int AS n FROM nested_effects WHERE event_id = $1 GROUP BY writer',
      [id],
    );
    return Object.fromEntries(rows.map((row) => [row.writer, row.n]));
  };
  const status = async (scope: string, id: string) => (await claimRow(db, scope, id))?.status;
  const counted = (scope: string, outcome: ClaimOutcome) =>
    running.app.get(IdempotencyMetrics).snapshot().claims[scope]?.[outcome] ?? 0;
  const innerRuns = (id: string) => recorder.innerRuns.filter((run) => run === id).length;
  const uid = (name: string) => `evt_${name}_${adapter}`;

  /**
   * Resolves once a delivery has reached the gate `gate`; rejects as soon as it is answered
   * instead (it failed before getting there), or after 10 s.
   */
  const reachGate = (answer: Promise<request.Response>, gate: string) =>
    within(
      Promise.race([
        running.app.get(Gates).entered(gate),
        answer.then((response) => {
          throw new Error(
            `answered ${response.status} before reaching ${gate}: ${JSON.stringify(response.body)}`,
          );
        }),
      ]),
      10_000,
      `the delivery to reach ${gate}`,
    );

  /** Runs parked by the test: each holds one of the pool's two connections until released. */
  const parked: { release(): void; run: Promise<unknown> }[] = [];
  afterEach(async () => {
    // Released whatever the test's outcome, so one failure does not starve the pool for the next.
    for (const run of parked.splice(0)) {
      run.release();
      await run.run.catch(() => undefined);
    }
  });

  /**
   * A top-level run of INNER_SCOPE for `id`, parked after `write`: inside its open transaction, or
   * (external) under its live lease.
   */
  async function holdInner(
    id: string,
    write: (delivery: IdempotentDelivery) => Promise<unknown>,
    options: { external?: boolean } = {},
  ) {
    let release!: () => void;
    const released = new Promise<void>((done) => (release = done));
    let entered = false;
    const run = service.run({ scope: INNER_SCOPE, key: id, ...options }, async (delivery) => {
      await write(delivery);
      entered = true;
      await released;
      return 'parked run finished';
    });
    parked.push({ release, run });
    await waitUntil(() => entered, 'the parked run to start its work');
    return { release, run };
  }

  describe("propagation 'required' (the default)", () => {
    it('joins the enclosing transaction: one transaction, the inner delivery under its own scope', async () => {
      const id = uid('join');
      const answer = await outer({ id });
      expect(answer.status).toBe(200);
      const body = answer.body as NestedAnswer;
      expect(body.inner).toEqual({ status: 'processed', value: `inner done for ${id}` });
      // The same transaction: the same txid, and both claims carry its start time.
      expect(body.innerTx).toBe(body.outerTx);
      expect(body.innerScope).toBe(INNER_SCOPE);
      expect(body.scopeAfter).toBe(OUTER_SCOPE);
      expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
      const [outerClaim, innerClaim] = [
        await claimRow(db, OUTER_SCOPE, id),
        await claimRow(db, INNER_SCOPE, id),
      ];
      expect(outerClaim).toMatchObject({ status: 'done', attempts: 1 });
      expect(innerClaim).toMatchObject({ status: 'done', attempts: 1 });
      expect(innerClaim!.completed_at).toBe(outerClaim!.completed_at);
    });

    it.each([
      ['the outer delivery’s manager', true],
      ['its own delivery’s manager', false],
    ])(
      'rolls the inner claim and what it wrote through %s back with the outer; the redelivery makes each effect once',
      async (_through, throughOuter) => {
        const id = uid(`outer_fails_${throughOuter ? 'outer' : 'own'}`);
        const failed = await outer({ id, throughOuter, outerFails: true });
        expect(failed.status).toBe(500);
        expect(await effects(id)).toEqual({});
        const afterFailure = { outer: await status(OUTER_SCOPE, id), inner: await status(INNER_SCOPE, id) };

        const redelivered = await outer({ id, throughOuter });
        expect(redelivered.status).toBe(200);
        // Each effect once (the review found 1 outer row and 0 inner rows here: the inner claim had
        // stayed done, so the redelivery replayed it).
        expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
        expect(redelivered.body.inner).toEqual({ status: 'processed', value: `inner done for ${id}` });
        // Not done after the failure: nothing of the inner claim outlived the outer's rollback.
        expect(afterFailure).toEqual({ outer: 'failed', inner: undefined });
        expect(await status(OUTER_SCOPE, id)).toBe('done');
        expect(await status(INNER_SCOPE, id)).toBe('done');
        expect(innerRuns(id)).toBe(2);
      },
    );

    it.each([
      ['the outer delivery’s manager', true],
      ['its own delivery’s manager', false],
    ])(
      'rolls back to the savepoint what a failed inner claim wrote through %s; the outer that catches it commits',
      async (_through, throughOuter) => {
        const id = uid(`inner_fails_${throughOuter ? 'outer' : 'own'}`);
        const failedBefore = counted(INNER_SCOPE, 'failed');
        const answer = await outer({ id, throughOuter, innerFails: true, catchInner: true });
        expect(answer.status).toBe(200);
        expect(answer.body.error).toMatchObject({ name: 'Error', message: 'inner claim failed on purpose' });
        expect(answer.body.scopeAfter).toBe(OUTER_SCOPE);
        expect(await effects(id)).toEqual({ outer: 1 });
        expect(await status(OUTER_SCOPE, id)).toBe('done');
        expect(await status(INNER_SCOPE, id)).not.toBe('done');
        expect(counted(INNER_SCOPE, 'failed')).toBe(failedBefore + 1);

        // The inner event is still to do: its next claim runs it.
        const ran = await service.run({ scope: INNER_SCOPE, key: id }, async (delivery) => {
          await delivery.manager.query('INSERT INTO nested_effects (event_id, writer) VALUES ($1, $2)', [
            id,
            'inner',
          ]);
          return 'ran';
        });
        expect(ran).toEqual({ status: 'processed', value: 'ran' });
        expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
      },
    );

    it.each([
      ['the outer delivery’s manager', true],
      ['its own delivery’s manager', false],
    ])(
      'rolls back to the savepoint a statement of the inner claim that failed through %s; the outer that catches it commits',
      async (_through, throughOuter) => {
        const id = uid(`inner_violates_${throughOuter ? 'outer' : 'own'}`);
        const answer = await outer({ id, throughOuter, innerViolates: true, catchInner: true });
        // The outer's transaction is usable again after the savepoint's rollback: its COMMIT commits.
        expect(answer.status).toBe(200);
        expect(answer.body.error).toMatchObject({ code: '23505' });
        expect(await effects(id)).toEqual({ outer: 1 });
        expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [`dup:${id}`])).toBe(0);
        expect(await status(OUTER_SCOPE, id)).toBe('done');
        expect(await status(INNER_SCOPE, id)).not.toBe('done');
      },
    );

    it('replays an inner claim already done, without running it', async () => {
      const id = uid('inner_done');
      expect(await service.run({ scope: INNER_SCOPE, key: id }, () => 'first')).toEqual({
        status: 'processed',
        value: 'first',
      });
      const answer = await outer({ id });
      expect(answer.status).toBe(200);
      expect(answer.body.inner).toEqual({ status: 'replayed' });
      expect(innerRuns(id)).toBe(0);
      expect(await effects(id)).toEqual({ outer: 1 });
      expect(await status(OUTER_SCOPE, id)).toBe('done');
    });

    it.each([
      { what: 'claims its event', before: 'none' as const },
      { what: 'finds its event done', before: 'done' as const },
      { what: 'finds its event held by a live external-mode lease', before: 'leased' as const },
    ])(
      'leaves the enclosing transaction’s lock_timeout as it was when the inner claim $what',
      async ({ before }) => {
        const id = uid(`lock_timeout_${before}`);
        if (before === 'done') await service.run({ scope: INNER_SCOPE, key: id }, () => 'first');
        if (before === 'leased') await holdInner(id, async () => undefined, { external: true });
        const answer = await outer({ id, catchInner: true });
        expect(answer.status).toBe(200);
        if (before === 'leased') expect(answer.body.error).toMatchObject({ code: 'IDEMPOTENCY_IN_FLIGHT' });
        else
          expect(answer.body.inner).toMatchObject({ status: before === 'done' ? 'replayed' : 'processed' });
        // The claim bounds its own wait with lock_timeout; the rest of the outer handler's
        // statements must not inherit that short bound.
        expect(answer.body.lockTimeoutAfter).toBe(answer.body.lockTimeoutBefore);
      },
    );

    it('answers 409 + Retry-After when another transaction holds the inner event; the outer is rolled back, not failed', async () => {
      const id = uid('inner_in_flight');
      const holder = await holdInner(id, (delivery) =>
        delivery.manager.query('INSERT INTO nested_effects (event_id, writer) VALUES ($1, $2)', [
          id,
          'inner',
        ]),
      );
      const inFlightBefore = counted(OUTER_SCOPE, 'in_flight');
      const failedBefore = counted(OUTER_SCOPE, 'failed');

      const answer = await within(outer({ id }), 10_000, 'the nested delivery to be answered');
      expect(answer.status).toBe(409);
      // How long this scope's deliveries take, at most the configured Retry-After.
      const retryAfter = Number(answer.headers['retry-after']);
      expect(retryAfter).toBeGreaterThanOrEqual(1);
      expect(retryAfter).toBeLessThanOrEqual(RETRY_AFTER_SECONDS);
      expect(await effects(id)).toEqual({});
      // Rolled back and not recorded as the handler's failure: nothing it could have done better.
      expect(await status(OUTER_SCOPE, id)).toBeUndefined();
      expect(counted(OUTER_SCOPE, 'in_flight')).toBe(inFlightBefore + 1);
      expect(counted(OUTER_SCOPE, 'failed')).toBe(failedBefore);
      expect(innerRuns(id)).toBe(0);

      holder.release();
      expect(await holder.run).toEqual({ status: 'processed', value: 'parked run finished' });
      const redelivered = await outer({ id });
      expect(redelivered.status).toBe(200);
      expect(redelivered.body.inner).toEqual({ status: 'replayed' });
      expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
    });

    it('rejects the inner run() with EventInFlightError when another transaction holds its event; the outer may go on', async () => {
      const id = uid('inner_in_flight_caught');
      const holder = await holdInner(id, async () => undefined);

      const answer = await within(
        outer({ id, catchInner: true }),
        10_000,
        'the nested delivery to be answered',
      );
      expect(answer.status).toBe(200);
      expect(answer.body.error).toEqual({
        name: 'EventInFlightError',
        code: 'IDEMPOTENCY_IN_FLIGHT',
        message: `Event ${id} is being processed by another delivery; retry later`,
        scope: INNER_SCOPE,
        retryAfterSeconds: expect.any(Number),
      });
      expect(answer.body.error.retryAfterSeconds).toBeGreaterThanOrEqual(1);
      expect(answer.body.error.retryAfterSeconds).toBeLessThanOrEqual(RETRY_AFTER_SECONDS);
      expect(await effects(id)).toEqual({ outer: 1 });
      expect(await status(OUTER_SCOPE, id)).toBe('done');
      expect(innerRuns(id)).toBe(0);
      holder.release();
      await holder.run;
      expect(await status(INNER_SCOPE, id)).toBe('done');
    });

    it(`answers 6 concurrent nested deliveries 200 on a pool of ${POOL_SIZE}, one connection each`, async () => {
      const ids = Array.from({ length: 6 }, (_, i) => uid(`pool_${i}`));
      // Two at a time meet inside their transactions before claiming the inner event: each holds
      // one of the pool's two connections while it asks for the inner claim.
      const answers = await within(
        Promise.all(ids.map((id) => outer({ id, rendezvous: POOL_SIZE }))),
        10_000,
        `6 nested deliveries on a pool of ${POOL_SIZE}`,
      );
      expect(answers.map((answer) => answer.status)).toEqual(ids.map(() => 200));
      for (const [i, id] of ids.entries()) {
        expect(answers[i].body.innerTx).toBe(answers[i].body.outerTx);
        expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
      }
      expect(
        await db.count(
          `SELECT count(*) FROM processed_events WHERE event_key = ANY($1) AND status = 'done'`,
          [ids],
        ),
      ).toBe(12);
    });

    it('counts the inner claim claimed, or reclaimed, only once the enclosing transaction commits', async () => {
      const id = uid('metrics');
      const before = (outcome: ClaimOutcome) => counted(INNER_SCOPE, outcome);
      const claimed = before('claimed');
      const replayed = before('replayed');
      expect((await outer({ id, outerFails: true })).status).toBe(500);
      expect(counted(INNER_SCOPE, 'claimed')).toBe(claimed);
      expect((await outer({ id })).status).toBe(200);
      expect(counted(INNER_SCOPE, 'claimed')).toBe(claimed + 1);
      expect(counted(INNER_SCOPE, 'replayed')).toBe(replayed);

      // A failed claim of the inner event, taken back inside a delivery: reclaimed, at the COMMIT.
      const failedId = uid('metrics_reclaim');
      await expect(
        service.run({ scope: INNER_SCOPE, key: failedId }, () =>
          Promise.reject(new Error('first try failed')),
        ),
      ).rejects.toThrow('first try failed');
      expect(await status(INNER_SCOPE, failedId)).toBe('failed');
      const reclaimed = before('reclaimed');
      expect((await outer({ id: failedId, outerFails: true })).status).toBe(500);
      expect(counted(INNER_SCOPE, 'reclaimed')).toBe(reclaimed);
      expect(await status(INNER_SCOPE, failedId)).toBe('failed');
      expect((await outer({ id: failedId })).status).toBe(200);
      expect(counted(INNER_SCOPE, 'reclaimed')).toBe(reclaimed + 1);
      expect(await claimRow(db, INNER_SCOPE, failedId)).toMatchObject({ status: 'done', attempts: 2 });
    });

    it('claims on its own inside an external-mode delivery, which holds no transaction', async () => {
      const id = uid('inside_external');
      const answer = await post('/nested/outer-external', { id });
      expect(answer.status).toBe(200);
      expect(answer.body.inner).toEqual({ status: 'processed', value: `inner done for ${id}` });
      expect(answer.body.outerTx).toBe('none');
      expect(answer.body.innerTx).toEqual(expect.any(String));
      expect(answer.body.innerScope).toBe(INNER_SCOPE);
      expect(answer.body.scopeAfter).toBe(OUTER_EXTERNAL_SCOPE);
      expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
      expect(await status(INNER_SCOPE, id)).toBe('done');
      expect(await status(OUTER_EXTERNAL_SCOPE, id)).toBe('done');
    });

    it('joins from an @Idempotent method the handler calls', async () => {
      const id = uid('method');
      const answer = await post('/nested/methods', { id });
      expect(answer.status).toBe(200);
      expect(answer.body.joined).toEqual({ txid: answer.body.outerTx, scope: METHOD_SCOPE });
      expect(answer.body.scopeAfter).toBe(OUTER_SCOPE);
      expect(await status(METHOD_SCOPE, id)).toBe('done');
      expect(await effects(id)).toEqual({ outer: 1, method: 1 });
    });
  });

  describe("propagation 'requiresNew'", () => {
    it('claims on a connection of its own and commits on its own: it survives the outer’s rollback', async () => {
      const id = uid('requires_new');
      const failed = await outer({ id, propagation: 'requiresNew', outerFails: true });
      expect(failed.status).toBe(500);
      expect(await effects(id)).toEqual({ inner: 1 });
      expect(await status(INNER_SCOPE, id)).toBe('done');
      expect(await status(OUTER_SCOPE, id)).toBe('failed');

      // The redelivery replays it: its effect stays one.
      const redelivered = await outer({ id, propagation: 'requiresNew' });
      expect(redelivered.status).toBe(200);
      expect(redelivered.body.inner).toEqual({ status: 'replayed' });
      expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
      expect(innerRuns(id)).toBe(1);

      const other = await outer({ id: `${id}_tx`, propagation: 'requiresNew' });
      expect(other.status).toBe(200);
      expect(other.body.innerTx).not.toBe(other.body.outerTx);
    });

    it('runs an external-mode claim inside a transaction-mode delivery on its own lease', async () => {
      const id = uid('requires_new_external');
      const answer = await outer({ id, innerExternal: true, propagation: 'requiresNew' });
      expect(answer.status).toBe(200);
      expect(answer.body.inner).toEqual({ status: 'processed', value: `inner done for ${id}` });
      expect(await claimRow(db, INNER_SCOPE, id)).toMatchObject({
        status: 'done',
        attempts: 1,
        lease_token: expect.any(String),
      });
      expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
    });
  });

  describe('refusals (PropagationError, nothing claimed)', () => {
    it.each([
      {
        what: 'an external-mode claim inside a transaction-mode delivery',
        path: '/nested/outer',
        event: { innerExternal: true },
        enclosing: OUTER_SCOPE,
        message: refusals.leaseCannotJoin(INNER_SCOPE, OUTER_SCOPE),
        outerEffect: 1,
      },
      {
        what: "'mandatory' inside an external-mode delivery",
        path: '/nested/outer-external',
        event: { propagation: 'mandatory' as const },
        enclosing: OUTER_EXTERNAL_SCOPE,
        message: refusals.mandatoryInsideExternal(INNER_SCOPE, OUTER_EXTERNAL_SCOPE),
        outerEffect: 1,
      },
      {
        what: "'never' inside a transaction-mode delivery",
        path: '/nested/outer',
        event: { propagation: 'never' as const },
        enclosing: OUTER_SCOPE,
        message: refusals.never(INNER_SCOPE, OUTER_SCOPE),
        outerEffect: 1,
      },
      {
        what: "'never' inside an external-mode delivery",
        path: '/nested/outer-external',
        event: { propagation: 'never' as const },
        enclosing: OUTER_EXTERNAL_SCOPE,
        message: refusals.never(INNER_SCOPE, OUTER_EXTERNAL_SCOPE),
        outerEffect: 1,
      },
    ])('refuses $what, naming both scopes', async ({ path, event, enclosing, message }) => {
      const id = uid(`refused_${path.length}_${event.propagation ?? 'external'}`);
      const answer = await post(path, { id, ...event, catchInner: true });
      expect(answer.status).toBe(200);
      expect(answer.body.error).toEqual({
        name: 'PropagationError',
        code: 'IDEMPOTENCY_PROPAGATION',
        message,
        scope: INNER_SCOPE,
        enclosingScope: enclosing,
      });
      expect(innerRuns(id)).toBe(0);
      expect(await claimRow(db, INNER_SCOPE, id)).toBeUndefined();
      expect(await effects(id)).toEqual({ outer: 1 });
    });

    it('fails the outer delivery that lets the refusal through: 500, its claim failed with the message', async () => {
      const id = uid('refused_uncaught');
      const answer = await outer({ id, innerExternal: true });
      expect(answer.status).toBe(500);
      expect(await claimRow(db, OUTER_SCOPE, id)).toMatchObject({
        status: 'failed',
        last_error: refusals.leaseCannotJoin(INNER_SCOPE, OUTER_SCOPE),
      });
      expect(await claimRow(db, INNER_SCOPE, id)).toBeUndefined();
      expect(await effects(id)).toEqual({});
    });

    it("refuses 'mandatory' outside any delivery, and runs 'never' there", async () => {
      const id = uid('outside');
      const calls: string[] = [];
      const refused = service.run({ scope: INNER_SCOPE, key: id, propagation: 'mandatory' }, () => {
        calls.push('mandatory');
      });
      await expect(refused).rejects.toBeInstanceOf(PropagationError);
      await expect(refused).rejects.toMatchObject({
        code: 'IDEMPOTENCY_PROPAGATION',
        message: refusals.mandatoryOutside(INNER_SCOPE),
        scope: INNER_SCOPE,
        key: id,
        enclosingScope: undefined,
      });
      expect(calls).toEqual([]);
      expect(await claimRow(db, INNER_SCOPE, id)).toBeUndefined();

      expect(
        await service.run({ scope: INNER_SCOPE, key: id, propagation: 'never' }, () => {
          calls.push('never');
          return 'ran';
        }),
      ).toEqual({ status: 'processed', value: 'ran' });
      expect(calls).toEqual(['never']);
      expect(await status(INNER_SCOPE, id)).toBe('done');
    });

    it("joins with 'mandatory' inside a transaction-mode delivery", async () => {
      const id = uid('mandatory_joins');
      const answer = await outer({ id, propagation: 'mandatory' });
      expect(answer.status).toBe(200);
      expect(answer.body.inner).toEqual({ status: 'processed', value: `inner done for ${id}` });
      expect(answer.body.innerTx).toBe(answer.body.outerTx);
      expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
    });

    it("refuses an @Idempotent method with 'never' called inside a delivery", async () => {
      const id = uid('method_never');
      const answer = await post('/nested/methods', { id });
      expect(answer.status).toBe(200);
      expect(answer.body.never).toEqual({
        name: 'PropagationError',
        code: 'IDEMPOTENCY_PROPAGATION',
        message: refusals.never(NEVER_METHOD_SCOPE, OUTER_SCOPE),
      });
      expect(await claimRow(db, NEVER_METHOD_SCOPE, id)).toBeUndefined();
      expect(await effects(id)).toEqual({ outer: 1, method: 1 });
    });
  });

  describe('afterCommit()', () => {
    it('runs the callbacks once the COMMIT is visible, in registration order, an inner claim’s with the outer’s', async () => {
      const id = uid('after_order');
      const answer = await outer({ id, afterCommit: true });
      expect(answer.status).toBe(200);
      // Each saw its claim done from another connection: after the enclosing COMMIT, the inner's too.
      expect(recorder.runsOf(id)).toEqual([
        { name: 'outer:1', claim: 'done' },
        { name: 'inner', claim: 'done' },
        { name: 'outer:2', claim: 'done' },
      ]);
    });

    it('answers only once the callbacks have run, after the commit a duplicate already sees', async () => {
      const id = uid('after_before_answer');
      let answered = false;
      const answer = outer({ id, afterCommit: true, parkAfterCommit: true }).then((response) => {
        answered = true;
        return response;
      });
      const gates = running.app.get(Gates);
      await reachGate(answer, `after:${id}`);
      // Committed: a duplicate sent now is replayed, while the first callback is still parked.
      const duplicate = await outer({ id });
      expect(duplicate.status).toBe(200);
      expect(duplicate.headers['idempotent-replayed']).toBe('true');
      expect(answered).toBe(false);
      expect(recorder.runsOf(id)).toEqual([]);

      gates.open(`after:${id}`);
      expect((await answer).status).toBe(200);
      expect(recorder.runsOf(id).map((run) => run.name)).toEqual(['outer:1', 'inner', 'outer:2']);
    });

    it('never runs the callbacks of a delivery that failed; its redelivery runs them once', async () => {
      const id = uid('after_failed');
      expect((await outer({ id, afterCommit: true, outerFails: true })).status).toBe(500);
      expect(recorder.runsOf(id)).toEqual([]);
      expect((await outer({ id, afterCommit: true })).status).toBe(200);
      expect(recorder.runsOf(id).map((run) => run.name)).toEqual(['outer:1', 'inner', 'outer:2']);
      // Replayed: nothing runs again.
      expect((await outer({ id, afterCommit: true })).headers['idempotent-replayed']).toBe('true');
      expect(recorder.runsOf(id)).toHaveLength(3);
    });

    it('drops the callback of an inner claim rolled back to its savepoint, and runs the outer’s', async () => {
      const id = uid('after_savepoint');
      const answer = await outer({ id, afterCommit: true, innerFails: true, catchInner: true });
      expect(answer.status).toBe(200);
      expect(recorder.runsOf(id)).toEqual([
        { name: 'outer:1', claim: 'done' },
        { name: 'outer:2', claim: 'done' },
      ]);
    });

    it('logs a callback that throws and changes nothing: the others run, the answer is 200 processed', async () => {
      const id = uid('after_throws');
      const answer = await outer({ id, afterCommit: true, failingAfterCommit: true });
      expect(answer.status).toBe(200);
      expect(answer.headers['idempotent-replayed']).toBeUndefined();
      expect(answer.body.inner).toEqual({ status: 'processed', value: `inner done for ${id}` });
      expect(recorder.runsOf(id).map((run) => run.name)).toEqual([
        'outer:1',
        'outer:throws',
        'inner',
        'outer:2',
      ]);
      expect(
        logs.find(
          'error',
          `An afterCommit() callback of ${OUTER_SCOPE} failed for ${id}`,
          'after-commit callback failed on purpose',
        ),
      ).toHaveLength(1);
      expect(await status(OUTER_SCOPE, id)).toBe('done');
      expect(await effects(id)).toEqual({ outer: 1, inner: 1 });
    });

    it('external mode: runs after the fenced completion, an inner claim’s after its own COMMIT', async () => {
      const id = uid('after_external');
      const answer = await post('/nested/outer-external', { id, afterCommit: true });
      expect(answer.status).toBe(200);
      // The inner claim (its own transaction here) commits first; the outer's wait for its completion.
      expect(recorder.runsOf(id)).toEqual([
        { name: 'inner', claim: 'done' },
        { name: 'outer:1', claim: 'done', attempt: 1 },
        { name: 'outer:2', claim: 'done', attempt: 1 },
      ]);
    });

    it('external mode: never runs the callbacks of a delivery whose lease was taken over', async () => {
      const id = uid('after_lease_lost');
      const firstAnswer = post('/nested/outer-external', { id, afterCommit: true, block: true });
      await reachGate(firstAnswer, id);
      expect(await expireLease(running.app.get(DataSource), OUTER_EXTERNAL_SCOPE, id)).toBe(true);
      const second = await post('/nested/outer-external', { id, afterCommit: true });
      expect(second.status).toBe(200);
      expect(second.body.inner).toEqual({ status: 'replayed' });

      running.app.get(Gates).open(id);
      expect((await firstAnswer).status).toBe(200);
      // The first delivery's inner claim committed on its own (its callback ran); its outer
      // callbacks did not, as its completion matched nothing: only the second's ran.
      expect(recorder.runsOf(id)).toEqual([
        { name: 'inner', claim: 'done' },
        { name: 'outer:1', claim: 'done', attempt: 2 },
        { name: 'outer:2', claim: 'done', attempt: 2 },
      ]);
      expect(await claimRow(db, OUTER_EXTERNAL_SCOPE, id)).toMatchObject({ status: 'done', attempts: 2 });
    });

    it("runs a run() callback's delivery.afterCommit after its COMMIT, and not when it throws", async () => {
      const id = uid('after_run');
      const seen: (string | undefined)[] = [];
      const registerAndSee = (delivery: IdempotentDelivery) =>
        delivery.afterCommit(async () => {
          const [row] = (
            await db.pool.query('SELECT status FROM processed_events WHERE scope = $1 AND event_key = $2', [
              'nested.run',
              id,
            ])
          ).rows as { status: string }[];
          seen.push(row?.status);
        });
      await expect(
        service.run({ scope: 'nested.run', key: id }, (delivery) => {
          registerAndSee(delivery);
          throw new Error('run failed on purpose');
        }),
      ).rejects.toThrow('run failed on purpose');
      expect(seen).toEqual([]);
      expect(await service.run({ scope: 'nested.run', key: id }, registerAndSee)).toEqual({
        status: 'processed',
        value: undefined,
      });
      expect(seen).toEqual(['done']);
    });
  });
});

/**
 * Jobs enqueued by a claim made inside a delivery (the handoff on pg-boss): written with the
 * enclosing transaction's COMMIT, so they commit with it or not at all, and a savepoint's
 * rollback takes the inner claim's job with it.
 */
describe.each(onAdapter('fastify'))('jobs enqueued by a claim inside a delivery (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(NESTED_SCHEMA);
    running = await startApp(adapter, [
      NestedFixtureModule.forSettings({
        databaseUrl: db.url,
        idempotency: { handoff: { schema: JOB_SCHEMA, queues: { [NESTED_QUEUE]: {} } } },
      }),
    ]);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const outer = (body: NestedEvent) => request(running.url).post('/nested/outer').send(body);
  /** The jobs on NESTED_QUEUE for `id`: whose claim enqueued each, by writer (one transaction wrote both). */
  const jobs = async (id: string) => {
    const { rows } = await db.pool.query<{ scope: string; writer: string }>(
      `SELECT data->'event'->>'scope' AS scope, data->'data'->>'writer' AS writer
       FROM ${JOB_SCHEMA}.job WHERE name = $1 AND data->'event'->>'key' = $2 ORDER BY writer`,
      [NESTED_QUEUE, id],
    );
    return rows;
  };
  const effects = (id: string) => db.count('SELECT count(*) FROM nested_effects WHERE event_id = $1', [id]);

  it('commits the inner claim’s job with the outer delivery: none after its failure, one after its redelivery', async () => {
    const id = `evt_job_outer_fails_${adapter}`;
    expect((await outer({ id, enqueue: true, outerFails: true })).status).toBe(500);
    expect(await jobs(id)).toEqual([]);
    expect(await effects(id)).toBe(0);

    expect((await outer({ id, enqueue: true })).status).toBe(200);
    expect(await jobs(id)).toEqual([
      { scope: INNER_SCOPE, writer: 'inner' },
      { scope: OUTER_SCOPE, writer: 'outer' },
    ]);
    expect(await effects(id)).toBe(2);
  });

  it('rolls the job of a failed inner claim back with its savepoint; the outer’s own job commits', async () => {
    const id = `evt_job_inner_fails_${adapter}`;
    const answer = await outer({ id, enqueue: true, innerFails: true, catchInner: true });
    expect(answer.status).toBe(200);
    expect(answer.body.error).toMatchObject({ message: 'inner claim failed on purpose' });
    expect(await jobs(id)).toEqual([{ scope: OUTER_SCOPE, writer: 'outer' }]);
    expect(await effects(id)).toBe(1);
  });
});

describe('the propagation API', () => {
  it('is exported from the package entry points: Propagation and isIdempotencyError, PropagationError on /errors', () => {
    const exported = publicApi as Record<string, unknown>;
    expect(errorsEntry.PropagationError).toBe(PropagationError);
    expect(exported.Propagation).toEqual({
      Required: 'required',
      RequiresNew: 'requiresNew',
      Mandatory: 'mandatory',
      Never: 'never',
    });
    expect(typeof exported.isIdempotencyError).toBe('function');
  });
});
