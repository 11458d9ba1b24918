import { afterAll, beforeAll } from '@jest/globals';
import type { TestDatabase } from './database.js';
import { startPgBouncer, type PgBouncer, type PgBouncerOptions } from './pgbouncer.js';

/**
 * How an app under test reaches its database: straight to Postgres, or through PgBouncer in
 * transaction mode, where each transaction (and each statement outside one) may run on another
 * server connection, so a connection's prepared statements are not the next query's.
 */
export const ROUTES = ['direct', 'pgbouncer'] as const;
export type Route = (typeof ROUTES)[number];

/**
 * Server connections PgBouncer keeps per database for the route specs: fewer than the fixture
 * app's pool (10 connections), so the app's client connections really take turns on them.
 */
export const POOLER_SERVER_CONNECTIONS = 3;

/**
 * `cases` on every route, for describe.each: `[route, case]`, the direct ones first. Not for
 * platforms: the pooler changes what the database sees, not what HTTP answers, so a suite on
 * both routes runs each route on one platform (see external-mode and transaction-mode).
 */
export function onEveryRoute<T>(cases: readonly T[]): [Route, T][] {
  return ROUTES.flatMap((route) => cases.map((value): [Route, T] => [route, value]));
}

/**
 * One PgBouncer for the calling test file, started in beforeAll in front of the run's PostgreSQL
 * (it forwards every database, so each describe's own database goes through it) and stopped in
 * afterAll. Per file rather than per run: it starts in milliseconds, each file picks its own pool
 * mode and size, and its server connections belong to that file's databases alone. Returns a
 * getter, valid inside tests and hooks.
 */
export function pgBouncerPerFile(options: PgBouncerOptions = {}): () => PgBouncer {
  let pooler: PgBouncer | undefined;
  beforeAll(async () => {
    const server = process.env.TEST_POSTGRES_ADMIN_URL;
    if (!server) throw new Error('TEST_POSTGRES_ADMIN_URL is not set: run the tests through jest');
    pooler = await startPgBouncer(server, { poolSize: POOLER_SERVER_CONNECTIONS, ...options });
  });
  afterAll(async () => {
    await pooler?.stop();
  });
  return () => {
    if (!pooler) throw new Error('PgBouncer is not running: use it inside a test or hook');
    return pooler;
  };
}

/** The URL an app on `route` is given for `db`: its own, or the same database through `pooler`. */
export function routeUrl(route: Route, db: TestDatabase, pooler: () => PgBouncer): string {
  return route === 'direct' ? db.url : pooler().urlFor(db.url);
}
