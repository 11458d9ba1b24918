import { expect } from '@jest/globals';
import request from 'supertest';
import { IdempotencyMetrics } from '../../lib/observability/index.js';
import {
  ClaimStatementAppModule,
  ClaimStatementController,
  type ClaimStatementAppSettings,
} from '../fixtures/claim-statement.fixture.js';
import { startApp, type AdapterName, type RunningApp } from './app.js';
import type { TestDatabase } from './database.js';

/** Scope of ClaimStatementController.byId, where the tricky keys are claimed. */
export const BY_ID_SCOPE = 'ClaimStatementController.byId';

/** Scope of ClaimStatementController.caughtSqlError, whose handler swallows a failed statement. */
export const CAUGHT_SCOPE = 'ClaimStatementController.caughtSqlError';

/** The 500's message when Postgres turned the COMMIT into a ROLLBACK. */
export const abortedMessage = (key: string) =>
  `Event ${key} was not processed: a statement in its transaction failed, so nothing was committed; retry later`;

/** Settings of a ClaimStatementAppModule app on the suite's database. */
export type ClaimAppSettings = Omit<ClaimStatementAppSettings, 'databaseUrl'>;

/**
 * The apps, deliveries and reads of the suites on ClaimStatementAppModule (claim-statement, the
 * behaviour; wire-trace, the statements on the wire), on `adapter` and the database `db()` returns
 * (a getter: the database is made in beforeAll). Each delivery helper asserts its effect.
 */
export function claimStatementDeliveries(adapter: AdapterName, db: () => TestDatabase) {
  const apps: RunningApp[] = [];
  const boot = (settings: ClaimAppSettings) =>
    startApp(adapter, [ClaimStatementAppModule.forDatabase({ databaseUrl: db().url, ...settings })]);
  const handled = (running: RunningApp, route: string, key: string) =>
    running.app.get(ClaimStatementController).callsOf(route, key);
  const orders = (id: string) => db().count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  // Claims that committed: a handler's failure leaves a failed record, which claims nothing.
  const claims = (id: string) =>
    db().count(`SELECT count(*) FROM processed_events WHERE event_key = $1 AND status = 'done'`, [id]);
  /** Outcomes counted in CAUGHT_SCOPE by one app. */
  const caughtOutcomes = (running: RunningApp) =>
    running.app.get(IdempotencyMetrics).snapshot().claims[CAUGHT_SCOPE] ?? {};

  return {
    handled,
    orders,
    claims,
    caughtOutcomes,
    /** Starts an app kept until closeAll(). */
    async start(settings: ClaimAppSettings = {}) {
      const running = await boot(settings);
      apps.push(running);
      return running;
    },
    /** Closes every app start() made. */
    closeAll: () => Promise.all(apps.map((running) => running.close())),
    /** Starts an app for one test only; `use` runs with it and it is closed afterwards. */
    async withApp(settings: ClaimAppSettings, use: (running: RunningApp) => Promise<void>) {
      const running = await boot(settings);
      try {
        await use(running);
      } finally {
        await running.close();
      }
    },
    /** Sends a delivery twice: processed, then replayed without calling the handler. */
    async deliverTwice(running: RunningApp, path: string, id: string): Promise<request.Response> {
      const first = await request(running.url).post(path).send({ id });
      expect(first.status).toBe(200);
      expect(first.headers['idempotent-replayed']).toBeUndefined();
      const second = await request(running.url).post(path).send({ id });
      expect(second.status).toBe(200);
      expect(second.headers['idempotent-replayed']).toBe('true');
      return first;
    },
    /**
     * One delivery to caught-sql-error: the handler runs, Postgres rolls the COMMIT back, and the
     * answer is a 500 (never a 200 for nothing committed). Nothing is written, and the outcome is
     * counted 'failed', never 'claimed'.
     */
    async deliverAborted(running: RunningApp, id: string) {
      const before = caughtOutcomes(running);
      const calls = handled(running, 'caught-sql-error', id);
      const answer = await request(running.url).post('/claims/caught-sql-error').send({ id });
      expect(answer.status).toBe(500);
      expect(answer.body).toEqual({
        statusCode: 500,
        message: abortedMessage(id),
        error: 'Internal Server Error',
      });
      expect(answer.headers['idempotent-replayed']).toBeUndefined();
      expect(handled(running, 'caught-sql-error', id)).toBe(calls + 1);
      expect(await orders(id)).toBe(0);
      expect(await claims(id)).toBe(0);
      expect(caughtOutcomes(running)).toEqual({ ...before, failed: (before.failed ?? 0) + 1 });
    },
  };
}
