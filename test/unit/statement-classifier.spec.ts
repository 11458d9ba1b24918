import { beforeAll, describe, expect, it } from '@jest/globals';
import {
  loadStatementClassifier,
  StatementClassifier,
  type ParseTree,
} from '../../lib/postgres/statement.classifier.js';
import { STATEMENT_CASES } from '../fixtures/statement-cases.fixture.js';

/**
 * The outside-write check's classifier on PostgreSQL's own parser (libpg-query), case by case.
 * test/e2e/statement-classifier.e2e-spec.ts runs the same cases in a read-only transaction, so
 * that the server itself says which are writes.
 */
describe('StatementClassifier', () => {
  let classifier: StatementClassifier;
  let parse: (sql: string) => ParseTree;

  beforeAll(async () => {
    classifier = await loadStatementClassifier();
    // The parser itself, for the cache's tests: a classifier of their own counts its calls.
    parse = (classifier as unknown as { parse: (sql: string) => ParseTree }).parse;
  });

  it.each(STATEMENT_CASES.map((c) => [c.sql, c] as const))('%s', (sql, expected) => {
    const found = classifier.classify(sql);
    expect(found.effect).toBe(expected.effect);
    if (expected.tables) expect(found.tables).toEqual(expected.tables);
    if (expected.effect !== 'write') expect(found.tables).toEqual([]);
    if (expected.kind) expect(found.kind).toBe(expected.kind);
    if (expected.reason) expect(found.reason).toContain(expected.reason);
    expect(found.reason.length).toBeGreaterThan(0);
  });

  it('says why a statement it cannot decide is undecided, naming the function', () => {
    expect(classifier.classify('SELECT billing.charge($1, $2)')).toEqual({
      effect: 'undecided',
      kind: 'SELECT',
      tables: [],
      reason: expect.stringContaining('calls billing.charge()'),
    });
  });

  it('names the tables a write names, schema-qualified where the text qualifies them', () => {
    const found = classifier.classify(
      'WITH a AS (INSERT INTO "Sales"."Line ""Items""" (id) VALUES (1) RETURNING id) UPDATE orders SET amount = 1',
    );
    expect(found.tables).toEqual([{ name: 'orders' }, { schema: 'Sales', name: 'Line "Items"' }]);
    expect(found.reason).toContain('"Sales"."Line ""Items"""');
  });

  describe('its cache of texts', () => {
    function counted(options?: { entries?: number; maxLength?: number }) {
      const calls: string[] = [];
      const counting = new StatementClassifier((sql) => {
        calls.push(sql);
        return parse(sql);
      }, options);
      return { counting, calls };
    }

    it('parses a text once, however often it is sent', () => {
      const { counting, calls } = counted();
      const sql = 'INSERT INTO "orders"("event_id", "amount") VALUES ($1, $2)';
      const first = counting.classify(sql);
      for (let round = 0; round < 5; round++) expect(counting.classify(sql)).toBe(first);
      expect(calls).toEqual([sql]);
      expect(Object.isFrozen(first)).toBe(true);
    });

    it('keeps at most `entries` texts, dropping the least recently classified', () => {
      const { counting, calls } = counted({ entries: 2 });
      counting.classify('SELECT 1');
      counting.classify('SELECT 2');
      counting.classify('SELECT 1'); // now the most recent
      counting.classify('SELECT 3'); // drops SELECT 2
      expect(counting.cached).toBe(2);
      counting.classify('SELECT 1');
      counting.classify('SELECT 2');
      expect(calls).toEqual(['SELECT 1', 'SELECT 2', 'SELECT 3', 'SELECT 2']);
    });

    it('classifies a text longer than `maxLength` every time rather than keep it', () => {
      const { counting, calls } = counted({ maxLength: 20 });
      const long = `SELECT ${'1, '.repeat(20)}1`;
      counting.classify(long);
      counting.classify(long);
      expect(calls).toHaveLength(2);
      expect(counting.cached).toBe(0);
    });

    it('keeps what the parser refused too: the same text is refused the same way', () => {
      const { counting, calls } = counted();
      expect(counting.classify('SELEC 1').effect).toBe('undecided');
      expect(counting.classify('SELEC 1').effect).toBe('undecided');
      expect(calls).toHaveLength(1);
    });
  });
});
