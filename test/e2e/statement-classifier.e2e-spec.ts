import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type pg from 'pg';
import {
  READ_ONLY_FUNCTIONS,
  VOLATILE_READ_ONLY_FUNCTIONS,
} from '../../lib/postgres/statement.classifier.js';
import { STATEMENT_CASES, STATEMENT_CASES_SCHEMA } from '../fixtures/statement-cases.fixture.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/**
 * The classifier's cases (test/unit/statement-classifier.spec.ts) asked of PostgreSQL itself: a
 * read-only transaction refuses a write with 25006 before it changes anything, so each case runs
 * in `BEGIN READ ONLY` and the server says whether it writes. The cases where it refuses what
 * the classifier calls a read say why (a row lock, a sequence); an undecided case is one whose
 * text looks like a read and whose function or procedure writes.
 */
describe('the statement cases, as PostgreSQL runs them', () => {
  let db: TestDatabase;
  let client: pg.PoolClient;

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(STATEMENT_CASES_SCHEMA);
    client = await db.pool.connect();
  });

  afterAll(async () => {
    client?.release();
    await db?.drop();
  });

  /** The SQLSTATE the case fails with inside BEGIN READ ONLY, or 'ran'. */
  async function inReadOnly(sql: string, params?: unknown[]): Promise<string> {
    await client.query('BEGIN READ ONLY');
    try {
      await (params ? client.query(sql, params) : client.query(sql));
      return 'ran';
    } catch (error) {
      return (error as { code?: string }).code ?? String(error);
    } finally {
      await client.query('ROLLBACK');
    }
  }

  const runnable = STATEMENT_CASES.filter((c) => c.readOnly !== 'skip');

  it.each(runnable.map((c) => [c.sql, c] as const))('%s', async (sql, expected) => {
    expect(await inReadOnly(sql, expected.params)).toBe(expected.readOnly === 'refuses' ? '25006' : 'ran');
  });

  it('agrees with the server on every write, and says why where they part', () => {
    // Every case the classifier calls a write is one PostgreSQL refuses read-only.
    const writes = STATEMENT_CASES.filter((c) => c.effect === 'write');
    expect(writes.filter((c) => c.readOnly !== 'refuses').map((c) => c.sql)).toEqual([]);
    // The reads it refuses are row locks and sequences, each case saying so.
    const refusedReads = STATEMENT_CASES.filter((c) => c.effect === 'read' && c.readOnly === 'refuses');
    expect(refusedReads.map((c) => c.sql).sort()).toEqual(
      [
        'SELECT * FROM orders WHERE id = $1 FOR UPDATE',
        'SELECT * FROM orders FOR NO KEY UPDATE SKIP LOCKED',
        'SELECT * FROM orders FOR SHARE',
        `SELECT nextval('orders_id_seq')`,
        `SELECT setval('orders_id_seq', 10)`,
      ].sort(),
    );
  });

  it('knows the side-effect-free functions it lets through as built-ins, immutable or stable', async () => {
    const { rows } = await db.pool.query<{ proname: string; volatility: string[] }>(
      `SELECT proname, array_agg(DISTINCT provolatile::text) AS volatility FROM pg_proc
        WHERE pronamespace = 'pg_catalog'::regnamespace AND proname = ANY($1) AND prokind <> 'p'
        GROUP BY proname`,
      [[...READ_ONLY_FUNCTIONS, ...VOLATILE_READ_ONLY_FUNCTIONS]],
    );
    const catalog = new Map(rows.map((row) => [row.proname, row.volatility]));
    const missing = [...READ_ONLY_FUNCTIONS, ...VOLATILE_READ_ONLY_FUNCTIONS].filter(
      (name) => !catalog.has(name),
    );
    expect(missing).toEqual([]);
    const volatile = [...READ_ONLY_FUNCTIONS].filter((name) => catalog.get(name)?.includes('v'));
    expect(volatile).toEqual([]);
    // The volatile ones are listed apart, each with why it changes nothing.
    for (const name of VOLATILE_READ_ONLY_FUNCTIONS) expect(catalog.get(name)).toContain('v');
  });
});
