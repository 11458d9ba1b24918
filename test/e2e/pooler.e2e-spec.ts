import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import request from 'supertest';
import { ClaimDatabase } from '../../lib/postgres/claim-database.js';
import { prepareTransactionClaimSql } from '../../lib/postgres/claim.sql.js';
import type { PreparedStatementsOption } from '../../lib/postgres/prepared-statements.js';
import { IdempotentMethodFixtureModule, Ledger } from '../fixtures/idempotent-method.fixture.js';
import { NAMES_REQUEST_SCOPE, StatementNamesController } from '../fixtures/statement-names.fixture.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { startApp, type RunningApp } from '../support/app.js';
import { CLAIM_SQL, UNCHECKED_CLAIM_SQL } from '../support/claim-sql.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { pgBouncerPerFile } from '../support/database-routes.js';
import { LogCapture } from '../support/log-capture.js';
import type { PgBouncer } from '../support/pgbouncer.js';
import { waitUntil } from '../support/wait-until.js';

/** The app's pg pool: more client connections than PgBouncer has server connections below. */
const APP_CONNECTIONS = 8;
/** PgBouncer's server connections per database in transaction mode. */
const SERVER_CONNECTIONS = 3;
/** Distinct events per run, and how many deliveries they get in all (a third are duplicates). */
const EVENTS = 200;
/** Deliveries in flight at once. */
const IN_FLIGHT = 32;
/** Deliveries are shuffled within windows this long, so most duplicates are in flight together. */
const SHUFFLE_WINDOW = 48;
/** No delivery may take longer; a hang fails the test with its event named. */
const DELIVERY_TIMEOUT_MS = 30_000;
/** A run of deliveries takes seconds; on a busy two-core machine, several times that. */
const STRESS_TEST_MS = 120_000;

const TURNED_OFF = 'Prepared statements turned off';

/** What each mode's route writes: one row per effect, keyed by the event id. */
const MODES = [
  { mode: 'transaction', path: '/orders', effects: 'orders' },
  { mode: 'external', path: '/external', effects: 'downstream_calls' },
] as const;

/** One delivery's answer. */
interface Answer {
  id: string;
  status: number;
  replayed: boolean;
}

/**
 * Deliveries of `EVENTS` events named `<prefix>_<n>`: every event once, 2 in 5 twice more or
 * thrice (a third of all deliveries are duplicates), in an order fixed by a seeded generator and
 * shuffled only within windows, so that duplicates mostly arrive while the first is in flight.
 */
function deliveriesOf(prefix: string): string[] {
  const ids: string[] = [];
  for (let n = 0; n < EVENTS; n++) {
    const id = `${prefix}_${n}`;
    ids.push(id);
    if (n % 5 === 0 || n % 5 === 2) ids.push(id);
    if (n % 10 === 0) ids.push(id);
  }
  let seed = 0x9e3779b9;
  const random = () => {
    seed = (Math.imul(seed, 1_103_515_245) + 12_345) >>> 0;
    return seed / 2 ** 32;
  };
  for (let start = 0; start < ids.length; start += SHUFFLE_WINDOW) {
    const end = Math.min(ids.length, start + SHUFFLE_WINDOW);
    for (let i = end - 1; i > start; i--) {
      const j = start + Math.floor(random() * (i - start + 1));
      [ids[i], ids[j]] = [ids[j], ids[i]];
    }
  }
  return ids;
}

/** Sends every delivery, IN_FLIGHT at a time, and returns every answer. */
async function deliverAll(url: string, path: string, ids: string[]): Promise<Answer[]> {
  const answers: Answer[] = [];
  let next = 0;
  const worker = async () => {
    while (next < ids.length) {
      const id = ids[next++];
      const response = await fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ id }),
        signal: AbortSignal.timeout(DELIVERY_TIMEOUT_MS),
      }).catch((error: unknown) => {
        throw new Error(`delivery of ${id} got no answer: ${String(error)}`, { cause: error });
      });
      await response.arrayBuffer();
      answers.push({
        id,
        status: response.status,
        replayed: response.headers.get('idempotent-replayed') === 'true',
      });
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  return answers;
}

// Three server connections under the app's eight client connections.
const transactionPooler = pgBouncerPerFile({ poolSize: SERVER_CONNECTIONS });
// Server connections handed out in turn, for a claim that must meet them in a known order.
const roundRobinPooler = pgBouncerPerFile({ poolSize: 2, serverRoundRobin: true });
// Session mode ties a client connection to one server connection for its life: the server pool
// must hold the app's whole pool, as it must in production.
const sessionPooler = pgBouncerPerFile({ poolMode: 'session', poolSize: APP_CONNECTIONS });
// One server connection: every transaction of every client meets the statements the others left.
const oneServerPooler = pgBouncerPerFile({ poolSize: 1 });

/**
 * Through PgBouncer, default options, both modes: hundreds of deliveries, a third of them
 * duplicates, from a small pool of app connections taking turns on fewer server connections. A
 * transaction-mode pooler hands each transaction (and each statement outside one) whichever server
 * connection is free, so the statements a client connection prepared are often not on the server
 * connection its next delivery gets, which answers 42P05 or 26000 to the statement.
 */
describe.each(MODES)('through PgBouncer ($mode mode)', ({ mode, path, effects }) => {
  let db: TestDatabase;
  let running: RunningApp | undefined;
  let logs: LogCapture;

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterEach(async () => {
    await running?.close();
    running = undefined;
  });

  afterAll(async () => {
    await db?.drop();
  });

  async function start(pooler: PgBouncer, preparedStatements?: PreparedStatementsOption) {
    running = await startApp('express', [
      WebhookFixtureModule.forDatabase({
        databaseUrl: pooler.urlFor(db.url),
        poolSize: APP_CONNECTIONS,
        ...(preparedStatements !== undefined && { idempotency: { preparedStatements } }),
      }),
    ]);
    logs = new LogCapture();
    running.app.useLogger(logs);
    return { url: running.url, prepared: running.app.get(ClaimDatabase, { strict: false }).prepared };
  }

  /**
   * Sends every delivery of `prefix` and checks the promise: no 5xx, each event processed by
   * exactly one delivery and its effect there exactly once, every claim done (none left
   * in_progress or failed after its work). Returns PgBouncer's count of the app's connections.
   */
  async function deliverAndCheck(url: string, prefix: string, pooler: PgBouncer) {
    const ids = deliveriesOf(prefix);
    const events = [...new Set(ids)].sort();
    expect(ids.length - events.length).toBeGreaterThanOrEqual(ids.length * 0.3);
    const answers = await deliverAll(url, path, ids);

    expect(answers.filter((answer) => answer.status >= 500)).toEqual([]);
    expect(answers.filter((answer) => answer.status !== 200 && answer.status !== 409)).toEqual([]);
    const processedBy = new Map<string, number>();
    for (const answer of answers) {
      if (answer.status === 200 && !answer.replayed)
        processedBy.set(answer.id, (processedBy.get(answer.id) ?? 0) + 1);
    }
    expect([...processedBy.entries()].filter(([, count]) => count !== 1)).toEqual([]);
    expect([...processedBy.keys()].sort()).toEqual(events);

    const { rows: effectRows } = await db.pool.query<{ event_id: string; count: string }>(
      `SELECT event_id, count(*) FROM ${effects} WHERE event_id LIKE $1 GROUP BY event_id ORDER BY event_id`,
      [`${prefix}\\_%`],
    );
    expect(effectRows.filter((row) => row.count !== '1')).toEqual([]);
    expect(effectRows.map((row) => row.event_id)).toEqual(events);
    const { rows: claimRows } = await db.pool.query<{ status: string; count: string }>(
      `SELECT status, count(*) FROM processed_events WHERE event_key LIKE $1 GROUP BY status`,
      [`${prefix}\\_%`],
    );
    expect(claimRows).toEqual([{ status: 'done', count: String(events.length) }]);

    return pooler.pool(db.name);
  }

  it(
    'default options: no 5xx, every effect once, no lease left in progress, one warning that preparing stopped',
    async () => {
      const { url, prepared } = await start(transactionPooler());
      const pool = await deliverAndCheck(url, `evt_pool_auto_${mode}`, transactionPooler());
      expect(pool.servers).toBeLessThanOrEqual(SERVER_CONNECTIONS);
      expect(pool.clients).toBeGreaterThan(pool.servers);
      // More client connections than server connections: some statements met a server connection
      // that had not prepared them, or already had, and 'auto' stopped preparing.
      expect(prepared.active).toBe(false);
      expect(prepared.missCount).toBeGreaterThanOrEqual(3);
      expect(logs.find('warn', TURNED_OFF)).toHaveLength(1);
      expect(logs.find('error')).toEqual([]);
    },
    STRESS_TEST_MS,
  );

  it(
    'preparedStatements: true keeps preparing: more misses, each resent, still no 5xx and no stuck lease',
    async () => {
      const { url, prepared } = await start(transactionPooler(), true);
      const pool = await deliverAndCheck(url, `evt_pool_true_${mode}`, transactionPooler());
      expect(pool.servers).toBeLessThanOrEqual(SERVER_CONNECTIONS);
      expect(pool.clients).toBeGreaterThan(pool.servers);
      expect(prepared.active).toBe(true);
      expect(prepared.missCount).toBeGreaterThan(3);
      expect(logs.find('warn', TURNED_OFF)).toEqual([]);
      expect(logs.find('error')).toEqual([]);
    },
    STRESS_TEST_MS,
  );

  it(
    'session mode: a client keeps its server connection, so nothing is missed and statements stay prepared',
    async () => {
      const { url, prepared } = await start(sessionPooler());
      const pool = await deliverAndCheck(url, `evt_pool_session_${mode}`, sessionPooler());
      // Each client connection has a server connection of its own.
      expect(pool.servers).toBe(pool.clients);
      expect(prepared.missCount).toBe(0);
      expect(prepared.active).toBe(true);
      expect(logs.find('warn')).toEqual([]);
    },
    STRESS_TEST_MS,
  );
});

/**
 * A transaction-mode claim that misses again after correcting what it believed: behind a pooler
 * each try is a new transaction, so it may land on yet another server connection. Here PgBouncer
 * hands out its two server connections in turn, one that has the claim prepared and one that has
 * not. A claim without companions (`@Idempotent`, unchecked) meets 42P05 (PREPARE where it
 * exists), then 26000 (EXECUTE where it does not), then would meet 42P05 again: three tries
 * answered 503 before; the last try goes inline. A claim with companions (a webhook's, checked)
 * meets 42P05, and its next try reads what its server connection has before it PREPAREs: no
 * second miss.
 */
describe.each([
  {
    claim: 'without companions',
    misses: 2,
    statements: UNCHECKED_CLAIM_SQL,
    parameters: 4,
    start: (url: string) =>
      startApp('express', [
        IdempotentMethodFixtureModule.forDatabase(url, {
          poolSize: 1,
          idempotency: { preparedStatements: true },
        }),
      ]),
    deliver: async (running: RunningApp, id: string) => {
      await running.app.get(Ledger).record({ id });
    },
  },
  {
    claim: 'with companions',
    misses: 1,
    statements: CLAIM_SQL,
    parameters: 5,
    start: (url: string) =>
      startApp('express', [
        WebhookFixtureModule.forDatabase({
          databaseUrl: url,
          poolSize: 1,
          // No reporter: a query of its own would take the next server connection's turn.
          idempotency: { preparedStatements: true, reporter: false },
        }),
      ]),
    deliver: async (running: RunningApp, id: string) => {
      const answer = await request(running.url).post('/orders').send({ id });
      expect([answer.status, answer.headers['idempotent-replayed']]).toEqual([200, undefined]);
    },
  },
])(
  'a transaction claim $claim whose server connections take turns',
  ({ claim, misses, statements, parameters, start, deliver }) => {
    let db: TestDatabase;
    let running: RunningApp | undefined;

    beforeAll(async () => {
      db = await createTestDatabase();
    });

    afterAll(async () => {
      await running?.close();
      await db?.drop();
    });

    it(`preparedStatements: true: ${misses} miss(es), claimed once, no 503`, async () => {
      const url = roundRobinPooler().urlFor(db.url);
      running = await start(url);
      const prepared = running.app.get(ClaimDatabase, { strict: false }).prepared;
      const clients = Array.from({ length: 2 }, () => new pg.Client({ connectionString: url }));
      try {
        await Promise.all(clients.map((client) => client.connect()));
        // Both server connections opened: two transactions at once hold one each.
        await Promise.all(clients.map((client) => client.query('BEGIN')));
        await Promise.all(clients.map((client) => client.query('COMMIT')));
        // Each statement outside a transaction takes the next server connection in turn: the
        // first prepares the claim (with its companions), the second shows it has not, and the
        // first is next again.
        await clients[0].query(prepareTransactionClaimSql(statements, parameters));
        const { rows } = await clients[1].query(
          'SELECT count(*)::int AS count FROM pg_prepared_statements WHERE name = $1',
          [statements.transactionClaim.name],
        );
        expect(rows).toEqual([{ count: 0 }]);
      } finally {
        await Promise.all(clients.map((client) => client.end()));
      }

      // The app's connection never prepared the claim: PREPARE on the server that has it (42P05),
      // then, without companions, EXECUTE on the one that has not (26000) and inline; with them, a
      // read of that one's prepared statements and the PREPAREs it lacks.
      const id = `evt_pool_misses_${claim.replace(' ', '_')}`;
      await deliver(running, id);
      expect(prepared.missCount).toBe(misses);
      expect(await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [id])).toBe(1);
      const { rows } = await db.pool.query(
        'SELECT status, attempts FROM processed_events WHERE event_key = $1',
        [id],
      );
      expect(rows).toEqual([{ status: 'done', attempts: 1 }]);
    });
  },
);

/**
 * The claim at commit's insert travels in the COMMIT's query, EXECUTEd. A transaction-mode pooler
 * pins a server session to a transaction from its BEGIN to its COMMIT, but not from one
 * transaction to the next: what a client connection believes it prepared says nothing of the
 * session its next transaction meets. Prepared by the COMMIT itself, the insert met a session that
 * another replica had given it (42P05) or one that never had it (26000): the transaction was lost
 * and the handler ran again. It is prepared with the claim now (its companion), where a miss only
 * sends the claim again, and a COMMIT EXECUTEs it only on a session its claim proved has it.
 * preparedStatements: true, so that the misses never turn preparing off.
 */
describe('the claim at commit behind a pooler that hands one session to every client', () => {
  let db: TestDatabase;
  const running: RunningApp[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterEach(async () => {
    await Promise.all(running.splice(0).map((app) => app.close()));
  });

  afterAll(async () => {
    await db?.drop();
  });

  /** A replica of the request-mode fixture on one pool connection, through the one-session pooler. */
  async function replica() {
    const app = await startApp('express', [
      WebhookFixtureModule.forDatabase({
        databaseUrl: oneServerPooler().urlFor(db.url),
        poolSize: 1,
        controllers: [StatementNamesController],
        idempotency: { preparedStatements: true, reporter: false },
      }),
    ]);
    running.push(app);
    const controller = app.app.get(StatementNamesController);
    return {
      app,
      prepared: app.app.get(ClaimDatabase, { strict: false }).prepared,
      runs: (key: string) => controller.runs.get(key),
      failing: controller.failing,
      send: (key: string) =>
        request(app.url).post('/names/refunds').set('Idempotency-Key', `"${key}"`).send({ id: key }),
    };
  }

  /** What a request for `key` left: its effects and its claim row, with the stored status. */
  const left = async (key: string) => ({
    effects: await db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [key]),
    claims: (
      await db.pool.query(
        `SELECT status, response->'status' AS stored FROM processed_events WHERE scope = $1 AND event_key = $2`,
        [NAMES_REQUEST_SCOPE, key],
      )
    ).rows,
  });

  it('a replica whose session another replica prepared: 42P05 sends the claim again, and the handler runs once', async () => {
    const a = await replica();
    const b = await replica();
    expect((await a.send('key_pooled_a')).status).toBe(201);

    // B's connection never prepared anything; the one session has A's statements.
    const first = await b.send('key_pooled_b');
    const again = await b.send('key_pooled_b');
    expect({
      first: [first.status, first.body, first.headers['idempotent-replayed']],
      again: [again.status, again.body, again.headers['idempotent-replayed']],
      runs: b.runs('key_pooled_b'),
      ...(await left('key_pooled_b')),
    }).toEqual({
      first: [201, { processed: 'key_pooled_b' }, undefined],
      again: [201, { processed: 'key_pooled_b' }, 'true'],
      runs: 1,
      effects: 1,
      claims: [{ status: 'done', stored: 201 }],
    });
    // The scenario happened: B's first claim met the session's statements (42P05).
    expect(b.prepared.missCount).toBeGreaterThanOrEqual(1);
  });

  it('a replica that stores the response of a retried key (an UPDATE at the COMMIT) on a session another replica prepared: the handler runs once more, not twice', async () => {
    const a = await replica();
    const b = await replica();
    // A key that failed and is retried: its row is there (failed), so the response is stored by
    // an UPDATE sent with the COMMIT. A sends one first, leaving it on the one session.
    for (const { replica: r, key } of [
      { replica: a, key: 'key_retried_a' },
      { replica: b, key: 'key_retried_b' },
    ]) {
      r.failing.add(key);
      expect((await r.send(key)).status).toBe(500);
      r.failing.delete(key);
      expect((await r.send(key)).status).toBe(201);
    }
    // The scenario happened: B's first claim met the statements A left on the session (42P05).
    expect(b.prepared.missCount).toBeGreaterThanOrEqual(1);
    const again = await b.send('key_retried_b');
    expect({
      again: [again.status, again.body, again.headers['idempotent-replayed']],
      runs: b.runs('key_retried_b'),
      ...(await left('key_retried_b')),
    }).toEqual({
      again: [201, { processed: 'key_retried_b' }, 'true'],
      runs: 2,
      effects: 1,
      claims: [{ status: 'done', stored: 201 }],
    });
  });

  it('a replica whose session is replaced by one that never prepared: 26000 sends the claim again, and the handler runs once', async () => {
    const a = await replica();
    expect((await a.send('key_replaced_1')).status).toBe(201);
    const missesBefore = a.prepared.missCount;

    // The pooler's one session, ended: PgBouncer opens a new one, which has prepared nothing.
    const probe = new pg.Client({ connectionString: oneServerPooler().urlFor(db.url) });
    await probe.connect();
    let pid: number;
    try {
      pid = (await probe.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0].pid;
    } finally {
      await probe.end();
    }
    await db.pool.query('SELECT pg_terminate_backend($1)', [pid]);
    await waitUntil(
      async () => (await oneServerPooler().pool(db.name)).servers === 0,
      'PgBouncer closing the ended session',
    );

    const answer = await a.send('key_replaced_2');
    expect({
      answer: [answer.status, answer.body],
      runs: a.runs('key_replaced_2'),
      ...(await left('key_replaced_2')),
    }).toEqual({
      answer: [201, { processed: 'key_replaced_2' }],
      runs: 1,
      effects: 1,
      claims: [{ status: 'done', stored: 201 }],
    });
    // The scenario happened: A's claim met the new session without its statement (26000).
    expect(a.prepared.missCount).toBeGreaterThan(missesBefore);
  });
});
