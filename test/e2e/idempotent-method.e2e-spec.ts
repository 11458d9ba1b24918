import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { ContextIdFactory, Reflector } from '@nestjs/core';
import { SchedulerRegistry } from '@nestjs/schedule';
import { Test, type TestingModule } from '@nestjs/testing';
import {
  IdempotencyContext,
  Idempotent,
  type ClaimOutcome,
  type ClaimOutcomeEvent,
} from '../../lib/index.js';
import { InvalidIdempotencyKeyError } from '../../lib/errors/index.js';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import { IDEMPOTENT_METHOD_METADATA } from '../../lib/idempotency.constants.js';
import { calls } from '../fixtures/decorators.fixture.js';
import {
  bodyRuns,
  IdempotentMethodFixtureModule,
  JOB_NAMES,
  JOB_ROLE,
  Ledger,
  period,
  RequestLedger,
  ScheduledJobs,
  ticks,
  TransientLedger,
  type MethodFixtureSettings,
  type ScheduledMethod,
} from '../fixtures/idempotent-method.fixture.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';
import { waitUntil } from '../support/wait-until.js';

const notBound = (scope: string) =>
  `@Idempotent method ${scope} was called on an instance Nest did not create (new, useValue or useFactory): it has no IdempotencyService to claim with, so it did not run`;

const startApp = async (
  db: TestDatabase,
  settings: MethodFixtureSettings,
  logger: LogCapture,
): Promise<TestingModule> => {
  const app = await Test.createTestingModule({
    imports: [IdempotentMethodFixtureModule.forDatabase(db.url, settings)],
  }).compile();
  app.useLogger(logger);
  await app.init();
  return app;
};

/**
 * `@Idempotent` on provider methods nothing intercepts: called directly, the method runs once per
 * key under a claim, whatever the provider's scope, and refuses to run unclaimed.
 */
describe('@Idempotent on provider methods', () => {
  let db: TestDatabase;
  let app: TestingModule;
  const logger = new LogCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
    app = await startApp(db, {}, logger);
  });

  afterAll(async () => {
    await app?.close();
    await db?.drop();
  });

  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const written = async () => ({
    orders: await db.count('SELECT count(*) FROM orders'),
    claims: await db.count('SELECT count(*) FROM processed_events'),
  });
  const claims = (scope: string, key: string) =>
    db.count('SELECT count(*) FROM processed_events WHERE scope = $1 AND event_key = $2', [scope, key]);

  it('runs 20 concurrent calls with one key once; a later call is replayed (undefined)', async () => {
    const ledger = app.get(Ledger);
    const id = 'evt_method_storm';
    const results = await Promise.all(Array.from({ length: 20 }, () => ledger.record({ id })));

    expect(results.filter((result) => result !== undefined)).toEqual([
      { recorded: id, scope: 'Ledger.record' },
    ]);
    expect(results.filter((result) => result === undefined)).toHaveLength(19);
    expect(await ledger.record({ id })).toBeUndefined();
    expect(bodyRuns.get('Ledger.record')).toBe(1);
    expect(await orders(id)).toBe(1);
    expect(await claims('Ledger.record', id)).toBe(1);
    expect(app.get(IdempotencyMetrics).snapshot().claims['Ledger.record']).toEqual({
      claimed: 1,
      replayed: 20,
    });
  });

  it('rejects a bad key with InvalidIdempotencyKeyError, writing nothing and not running', async () => {
    const ledger = app.get(Ledger);
    const runs = bodyRuns.get('Ledger.record') ?? 0;
    const before = await written();
    const cases: [unknown, string][] = [
      ['', 'Idempotency key of Ledger.record is empty'],
      [undefined, 'Idempotency key of Ledger.record must be a string, got undefined'],
      [
        'evt_\u0000',
        'Idempotency key of Ledger.record contains a NUL character, which PostgreSQL text cannot store',
      ],
    ];
    for (const [id, message] of cases) {
      const error = await ledger.record({ id }).catch((rejection: unknown) => rejection);
      expect(error).toBeInstanceOf(InvalidIdempotencyKeyError);
      expect(error).toMatchObject({ message, scope: 'Ledger.record', code: 'IDEMPOTENCY_INVALID_KEY' });
    }
    expect(bodyRuns.get('Ledger.record') ?? 0).toBe(runs);
    expect(await written()).toEqual(before);
  });

  it('refuses to run on an instance Nest did not create', async () => {
    const before = bodyRuns.get('Ledger.record') ?? 0;
    const stray = new Ledger(app.get(IdempotencyContext));
    const id = 'evt_method_stray';

    await expect(stray.record({ id })).rejects.toThrow(notBound('Ledger.record'));
    expect(bodyRuns.get('Ledger.record') ?? 0).toBe(before);
    expect(await orders(id)).toBe(0);
    expect(await claims('Ledger.record', id)).toBe(0);
    // The same event through Nest's instance is processed: nothing was claimed by the refusal.
    expect(await app.get(Ledger).record({ id })).toEqual({ recorded: id, scope: 'Ledger.record' });
    expect(await orders(id)).toBe(1);
  });

  it('works on request-scoped instances, each injected with the service', async () => {
    const id = 'evt_method_request';
    const first = await app.resolve(RequestLedger, ContextIdFactory.create());
    const second = await app.resolve(RequestLedger, ContextIdFactory.create());
    expect(first).not.toBe(second);

    // One event across both instances: the scope is the class's, so the second is replayed.
    expect(await first.record({ id })).toEqual({ recorded: id, scope: 'RequestLedger.record' });
    expect(await second.record({ id })).toBeUndefined();
    expect(await second.record({ id: `${id}_2` })).toEqual({
      recorded: `${id}_2`,
      scope: 'RequestLedger.record',
    });
    expect(bodyRuns.get('RequestLedger.record')).toBe(2);
    expect(await orders(id)).toBe(1);
    expect(await orders(`${id}_2`)).toBe(1);
  });

  it('works on transient instances, each injected with the service', async () => {
    const id = 'evt_method_transient';
    const first = await app.resolve(TransientLedger);
    const second = await app.resolve(TransientLedger);
    expect(first).not.toBe(second);

    const results = await Promise.all([first.record({ id }), second.record({ id })]);
    expect(results.filter((result) => result !== undefined)).toEqual([
      { recorded: id, scope: 'TransientLedger.record' },
    ]);
    expect(bodyRuns.get('TransientLedger.record')).toBe(1);
    expect(await orders(id)).toBe(1);
  });

  it('refuses bad options when the decorator is applied, not at the first call', () => {
    expect(() => Idempotent({ key: undefined as never })).toThrow(
      new TypeError('@Idempotent needs a key function, e.g. { key: (event) => event.id }'),
    );
    const decorate = (options: Parameters<typeof Idempotent>[0]) => () => {
      class Job {
        async run() {}
      }
      Idempotent(options)(Job.prototype, 'run', Object.getOwnPropertyDescriptor(Job.prototype, 'run')!);
    };
    expect(decorate({ key: () => 'k', leaseMs: 1_000 })).toThrow(
      new TypeError(
        "@Idempotent leaseMs and heartbeat belong to external mode; add mode: 'external' or remove them",
      ),
    );
    expect(decorate({ key: () => 'k', mode: 'lease' as never })).toThrow(
      new TypeError("@Idempotent mode must be one of 'transaction', 'external', got lease"),
    );
  });
});

/**
 * `@Idempotent` stacked with @nestjs/schedule's decorators, `@SetMetadata` and a wrapping
 * decorator, in both orders: every decorator still sees what it set, the schedule explorer
 * registers the jobs, and real ticks run each job's body once per key.
 */
describe('@Idempotent with @Cron, @Interval and other decorators', () => {
  let db: TestDatabase;
  let app: TestingModule;
  const logger = new LogCapture();
  const methods = Object.keys(JOB_NAMES) as ScheduledMethod[];
  const scopeOf = (method: ScheduledMethod) => `ScheduledJobs.${method}`;
  const outcomes: ClaimOutcomeEvent[] = [];
  const outcomesOf = (method: ScheduledMethod, key: string, outcome: ClaimOutcome) =>
    outcomes.filter(
      (event) => event.scope === scopeOf(method) && event.key === key && event.outcome === outcome,
    ).length;

  beforeAll(async () => {
    db = await createTestDatabase();
    app = await startApp(
      db,
      { schedule: true, idempotency: { onOutcome: (event) => void outcomes.push(event) } },
      logger,
    );
  });

  afterAll(async () => {
    // Closing the app stops every interval and cron job.
    await app?.close();
    await db?.drop();
  });

  const effects = (method: ScheduledMethod, key: string) =>
    db.count('SELECT count(*) FROM orders WHERE event_id = $1', [`${scopeOf(method)}/${key}`]);

  it('keeps every metadata key and the method name, whichever decorator is applied last', () => {
    const reflector = app.get(Reflector);
    for (const method of methods) {
      const handler = ScheduledJobs.prototype[method];
      expect(handler.name).toBe(method);
      expect(reflector.get(JOB_ROLE, handler)).toBe(method.replace(/([A-Z])/, '-$1').toLowerCase());
      expect(reflector.get(IDEMPOTENT_METHOD_METADATA, handler)).toMatchObject({
        scope: scopeOf(method),
        mode: 'transaction',
      });
    }
  });

  it('is registered by the schedule explorer', () => {
    const registry = app.get(SchedulerRegistry);
    expect(registry.getIntervals().sort()).toEqual([JOB_NAMES.intervalAbove, JOB_NAMES.intervalBelow].sort());
    expect([...registry.getCronJobs().keys()].sort()).toEqual(
      [JOB_NAMES.cronAbove, JOB_NAMES.cronBelow].sort(),
    );
    expect(registry.getInterval(JOB_NAMES.intervalAbove)).toBeDefined();
    expect(registry.getCronJob(JOB_NAMES.cronBelow).isActive).toBe(true);
  });

  it('runs real ticks through the claim: one effect per key, however many ticks', async () => {
    // A period is over for the test once every job has run its body for it and had two more
    // ticks of it replayed: real ticks, counted by the library's onOutcome hook.
    const periodDone = (key: string) =>
      waitUntil(
        () =>
          methods.every(
            (method) => outcomesOf(method, key, 'claimed') === 1 && outcomesOf(method, key, 'replayed') >= 2,
          ),
        `every job to run once and replay twice for ${key}`,
        15_000,
      );
    const first = period.current;
    await periodDone(first);
    const second = 'period-2';
    period.current = second;
    await periodDone(second);

    for (const method of methods) {
      expect({ method, first: await effects(method, first) }).toEqual({ method, first: 1 });
      expect({ method, second: await effects(method, second) }).toEqual({ method, second: 1 });
      // One run of the body per period, however many ticks claimed it.
      expect({ method, runs: bodyRuns.get(scopeOf(method)) }).toEqual({ method, runs: 2 });
      expect(
        outcomes.filter((event) => event.scope === scopeOf(method) && event.outcome === 'claimed'),
      ).toHaveLength(2);
      expect(ticks.get(method)).toBeGreaterThanOrEqual(6);
    }
    // Inside @Idempotent the wrapper counts runs of the body; outside it, every tick.
    expect(calls.wrapper.get('intervalAbove')).toBe(2);
    expect(calls.wrapper.get('cronAbove')).toBe(2);
    for (const method of ['intervalBelow', 'cronBelow'] as const) {
      const counted = outcomes.filter((event) => event.scope === scopeOf(method)).length;
      expect(calls.wrapper.get(method)).toBeGreaterThanOrEqual(counted);
    }
    expect(logger.find('error')).toEqual([]);
  });
});
