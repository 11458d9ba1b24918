import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { OutsideWritesFixtureModule } from '../fixtures/outside-writes.fixture.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';

/**
 * A transaction-mode handler that writes through an injected repository or the DataSource, not the
 * claim's manager: that write commits on its own, so a failure after it leaves it behind and the
 * redelivery writes it again. The library says so once per handler, naming the entity and the
 * handler, and with `strictTransactions` refuses the write before it runs.
 */
describe.each(onAdapter('fastify'))('writes outside the claim’s transaction (%s)', (adapter) => {
  let db: TestDatabase;
  let lenient: RunningApp;
  let strict: RunningApp;
  const logs = new LogCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
    // The app's own function (VOLATILE, the default): a read here, but its text cannot say so.
    await db.pool.query(
      `CREATE FUNCTION outside_orders_seen(event text) RETURNS int LANGUAGE sql
         AS $$ SELECT count(*)::int FROM orders WHERE event_id = event $$`,
    );
    lenient = await startApp(adapter, [OutsideWritesFixtureModule.forDatabase(db.url, false)]);
    strict = await startApp(adapter, [OutsideWritesFixtureModule.forDatabase(db.url, true)]);
    // Nest's logger is process-wide: installed last, it hears both apps.
    lenient.app.useLogger(logs);
  });

  beforeEach(() => logs.clear());

  afterAll(async () => {
    await lenient?.close();
    await strict?.close();
    await db?.drop();
  });

  const orders = (id: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id]);
  const claim = async (id: string) =>
    (await db.pool.query('SELECT status FROM processed_events WHERE event_key = $1', [id])).rows;
  const warnings = (scope: string) =>
    logs.find('warn', `${scope} wrote to`, "outside its claim's transaction");

  it('reports an injected repository’s write once per handler, naming the entity and the handler', async () => {
    const id = `evt_outside_repo_${adapter}`;
    // The hole this catches: the handler fails after the write; the claim rolls back, the row stays.
    expect((await request(lenient.url).post('/outside/repository').send({ id, fail: true })).status).toBe(
      500,
    );
    expect(await claim(id)).toEqual([{ status: 'failed' }]);
    expect(await orders(id)).toBe(1);

    const [warning] = warnings('outside.repository');
    expect(warning?.message).toContain('entity OrderRow (table "orders")');
    expect(warning?.message).toContain('strictTransactions: true refuses such writes');
    // Once per handler, however many deliveries make the same mistake.
    await request(lenient.url)
      .post('/outside/repository')
      .send({ id: `${id}_again` })
      .expect(200);
    expect(warnings('outside.repository')).toHaveLength(1);
  });

  it('reports raw SQL through the DataSource too, naming the table’s entity', async () => {
    const id = `evt_outside_ds_${adapter}`;
    await request(lenient.url).post('/outside/data-source').send({ id }).expect(200);
    expect(await orders(id)).toBe(1);
    expect(warnings('outside.data-source')[0]?.message).toContain('entity OrderRow (table "orders")');
  });

  it('says nothing of writes through the claim’s manager, reads elsewhere, or external mode', async () => {
    await request(lenient.url)
      .post('/outside/claim')
      .send({ id: `evt_outside_claim_${adapter}` })
      .expect(200);
    await request(lenient.url)
      .post('/outside/external')
      .send({ id: `evt_outside_ext_${adapter}` })
      .expect(200);
    expect(logs.find('warn', "outside its claim's transaction")).toEqual([]);
    expect(await orders(`evt_outside_claim_${adapter}`)).toBe(1);
  });

  it('with strictTransactions refuses the write before it runs: 500, nothing written, the redelivery too', async () => {
    const id = `evt_outside_strict_${adapter}`;
    for (let delivery = 1; delivery <= 2; delivery++) {
      const answer = await request(strict.url).post('/outside/repository').send({ id });
      expect(answer.status).toBe(500);
      expect(await orders(id)).toBe(0);
    }
    // The refusal is the handler's failure, recorded with the claim for the poison report.
    const { rows } = await db.pool.query(
      'SELECT status, attempts, last_error FROM processed_events WHERE event_key = $1',
      [id],
    );
    expect(rows).toEqual([
      { status: 'failed', attempts: 2, last_error: expect.stringContaining('Refused (strictTransactions)') },
    ]);
    expect(rows[0].last_error).toContain('outside.repository wrote to entity OrderRow');
    // Writes through the claim's manager go through as ever.
    await request(strict.url)
      .post('/outside/claim')
      .send({ id: `${id}_claim` })
      .expect(200);
    expect(await orders(`${id}_claim`)).toBe(1);
  });

  it('sees a write behind a leading comment (QueryBuilder .comment()): warned, and refused when strict', async () => {
    const id = `evt_outside_commented_${adapter}`;
    const answer = await request(strict.url).post('/outside/commented').send({ id });
    expect(answer.status).toBe(500);
    expect(await orders(id)).toBe(0);
    const { rows } = await db.pool.query(
      'SELECT status, last_error FROM processed_events WHERE event_key = $1',
      [id],
    );
    expect(rows).toEqual([
      { status: 'failed', last_error: expect.stringContaining('Refused (strictTransactions)') },
    ]);
    expect(rows[0].last_error).toContain('outside.commented wrote to entity OrderRow (table "orders")');

    await request(lenient.url)
      .post('/outside/commented')
      .send({ id: `${id}_lenient` })
      .expect(200);
    expect(warnings('outside.commented')[0]?.message).toContain('entity OrderRow (table "orders")');
  });

  it('lets a WITH read through whose literal, identifier and comments hold the write keywords', async () => {
    const id = `evt_outside_cte_${adapter}`;
    await request(strict.url).post('/outside/cte-read').send({ id }).expect(200);
    // The read ran (its one row counted) and the claim's write committed with the claim.
    const { rows } = await db.pool.query('SELECT amount FROM orders WHERE event_id = $1', [id]);
    expect(rows).toEqual([{ amount: 1 }]);
    expect(await claim(id)).toEqual([{ status: 'done' }]);
    expect(logs.find('warn', 'outside.cte-read')).toEqual([]);
  });

  it('reports a call of the app’s own function once per handler, and never refuses it, even strict', async () => {
    const id = `evt_outside_volatile_${adapter}`;
    await request(strict.url).post('/outside/volatile').send({ id }).expect(200);
    expect(await orders(id)).toBe(1);
    expect(await claim(id)).toEqual([{ status: 'done' }]);
    const reported = logs.find('warn', 'outside.volatile', 'outside_orders_seen');
    expect(reported).toHaveLength(1);
    expect(reported[0]?.message).toContain('SELECT');
    expect(reported[0]?.message).toContain('not refused');
    await request(strict.url)
      .post('/outside/volatile')
      .send({ id: `${id}_again` })
      .expect(200);
    expect(logs.find('warn', 'outside.volatile')).toHaveLength(1);
  });
});
