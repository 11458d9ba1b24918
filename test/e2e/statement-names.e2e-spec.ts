import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { ClaimDatabase } from '../../lib/postgres/claim-database.js';
import { statementName } from '../../lib/postgres/claim.sql.js';
import {
  NAMES_REQUEST_SCOPE,
  NAMES_SCOPE,
  StatementNamesController,
} from '../fixtures/statement-names.fixture.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { CLAIM_SQL } from '../support/claim-sql.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/** The name the previous release prepared its transaction claim under, for the default table. */
const OLD_CLAIM_NAME = 'idempotency_transaction_claim';

/**
 * Another release's statement under that name, with the claim's parameters (text, text, text,
 * text) and columns: it answers "claimed" and inserts nothing. A connection a pooler hands from
 * one release to the next during a rolling deploy can hold exactly this.
 */
const FOREIGN_CLAIM = `PREPARE ${OLD_CLAIM_NAME} (text, text, text, text) AS
SELECT true AS claimed, NULL::text AS status, current_setting('lock_timeout') AS previous
FROM (SELECT $1, $2, $3, $4) AS given`;

/**
 * The claim at commit as the release before sent it: the same text, with the claim's five values
 * (scope, key, source, lock_timeout, fingerprint; it read the first two), prepared under the name
 * its text alone gave it. This release sends it two: the same name would answer its EXECUTE
 * "wrong number of parameters" on every request of a connection that holds the old one.
 */
const OLD_CLAIM_AT_COMMIT_NAME = statementName('claim_at_commit', CLAIM_SQL.claimAtCommit!.text);
const OLD_CLAIM_AT_COMMIT = `PREPARE ${OLD_CLAIM_AT_COMMIT_NAME} (text, text, text, text, text) AS${CLAIM_SQL.claimAtCommit!.text}`;

/**
 * The claim at commit's companions, PREPAREd without the claim: what a PREPARE round that failed
 * between them and the claim's own PREPARE (a statement timeout, say) leaves on a session.
 */
const COMPANIONS_ALONE = CLAIM_SQL.claimAtCommit!.companions!.map(
  ({ name, text }) => `PREPARE ${name} AS ${text}`,
).join(';\n');

/**
 * A connection that already holds a statement under the name the library would prepare its claim
 * under (another release's, another copy's) must not make the library run that statement: the
 * names carry a hash of their text, so the library's claim is prepared under a name of its own,
 * the claim row is written and a redelivery is replayed. Before, the PREPARE met 42P05, was taken
 * to mean "mine", and the foreign statement ran: the handler ran with no claim row, and again on
 * every redelivery.
 */
describe.each(onAdapter('express'))('a foreign statement under the claim statement name (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp | undefined;

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

  const claims = (id: string, scope = NAMES_SCOPE) =>
    db.pool
      .query('SELECT status, attempts FROM processed_events WHERE scope = $1 AND event_key = $2', [scope, id])
      .then((result) => result.rows as { status: string; attempts: number }[]);
  const effects = (id: string) => db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [id]);

  /**
   * Starts the app on a pool of one connection and runs `prepare` on it: that PREPARE and every
   * delivery after it share the connection, whose backend pid is answered.
   */
  async function startHolding(
    prepare: string,
  ): Promise<{ app: RunningApp; dataSource: DataSource; pid: number }> {
    const app = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        poolSize: 1,
        controllers: [StatementNamesController],
        idempotency: { reporter: false },
      }),
    ]);
    running = app;
    const dataSource = app.app.get(DataSource);
    const [{ pid }] = (await dataSource.query('SELECT pg_backend_pid() AS pid')) as { pid: number }[];
    await dataSource.query(prepare);
    return { app, dataSource, pid };
  }

  it("runs the handler once and writes its claim row when the pool's only connection holds another release's claim statement", async () => {
    const { app, dataSource, pid } = await startHolding(FOREIGN_CLAIM);
    const id = `evt_foreign_${adapter}`;

    const first = await request(app.url).post('/names/orders').send({ id });
    const claimAfterFirst = await claims(id);
    const again = await request(app.url).post('/names/orders').send({ id });
    // Seen together, so that a failure shows the whole story: the answers, the claim row, the runs.
    expect({
      first: [first.status, first.body, first.headers['idempotent-replayed']],
      claimAfterFirst,
      again: [again.status, again.headers['idempotent-replayed']],
      runs: app.app.get(StatementNamesController).runs.get(id),
      effects: await effects(id),
      claims: await claims(id),
    }).toEqual({
      first: [200, { processed: id }, undefined],
      claimAfterFirst: [{ status: 'done', attempts: 1 }],
      again: [200, 'true'],
      runs: 1,
      effects: 1,
      claims: [{ status: 'done', attempts: 1 }],
    });

    // Still the one connection, holding both statements: the foreign one untouched, the library's
    // claim under a name of its own.
    const prepared = (await dataSource.query(
      `SELECT pg_backend_pid() AS pid, array_agg(name::text) AS names,
              bool_or(name = $1 AND statement LIKE '%FROM (SELECT $1, $2, $3, $4) AS given%') AS foreign_kept
       FROM pg_prepared_statements WHERE name LIKE 'idempotency_transaction_claim%'`,
      [OLD_CLAIM_NAME],
    )) as { pid: number; names: string[]; foreign_kept: boolean }[];
    expect({ ...prepared[0], names: prepared[0].names.sort() }).toEqual({
      pid,
      names: [OLD_CLAIM_NAME, CLAIM_SQL.transactionClaim.name].sort(),
      foreign_kept: true,
    });
  });

  it("claims a request at its COMMIT, once, when the pool's only connection holds the previous release's claim at commit, which took five values", async () => {
    const { app, dataSource, pid } = await startHolding(OLD_CLAIM_AT_COMMIT);
    const id = `evt_old_at_commit_${adapter}`;
    const send = () => request(app.url).post('/names/refunds').set('Idempotency-Key', `"${id}"`).send({ id });

    const first = await send();
    const again = await send();
    expect({
      first: [first.status, first.body, first.headers['idempotent-replayed']],
      again: [again.status, again.body, again.headers['idempotent-replayed']],
      runs: app.app.get(StatementNamesController).runs.get(id),
      effects: await effects(id),
      claims: await claims(id, NAMES_REQUEST_SCOPE),
    }).toEqual({
      first: [201, { processed: id }, undefined],
      again: [201, { processed: id }, 'true'],
      runs: 1,
      effects: 1,
      claims: [{ status: 'done', attempts: 1 }],
    });

    // The one connection holds both: the old statement untouched, this release's under its own
    // name, with the insert it is prepared with.
    const prepared = (await dataSource.query(
      `SELECT pg_backend_pid() AS pid, array_agg(name::text) AS names
       FROM pg_prepared_statements WHERE name LIKE 'idempotency_claim_at_commit%'`,
    )) as { pid: number; names: string[] }[];
    expect({ ...prepared[0], names: prepared[0].names.sort() }).toEqual({
      pid,
      names: [
        OLD_CLAIM_AT_COMMIT_NAME,
        CLAIM_SQL.claimAtCommit!.name,
        // Its insert, under the name it has with this claim (the stored response's is another role's).
        ...CLAIM_SQL.claimAtCommit!.companions!.filter(({ name }) =>
          name.startsWith('idempotency_claim_at_commit'),
        ).map(({ name }) => name),
      ].sort(),
    });
  });
  it("claims a request once and prepares its claim when the pool's only connection holds the claim's companions without it", async () => {
    const { app, dataSource } = await startHolding(COMPANIONS_ALONE);
    const prepared = app.app.get(ClaimDatabase, { strict: false }).prepared;
    const send = (id: string) =>
      request(app.url).post('/names/refunds').set('Idempotency-Key', `"${id}"`).send({ id });

    // The first PREPARE round meets a companion (42P05); the round after reads the session and
    // PREPAREs the claim alone, where guessing from the error would EXECUTE a claim not there.
    const ids = ['evt_companions_1', 'evt_companions_2'].map((id) => `${id}_${adapter}`);
    const answers = [];
    for (const id of ids) answers.push(await send(id));
    expect({
      answers: answers.map((answer) => [answer.status, answer.body]),
      runs: ids.map((id) => app.app.get(StatementNamesController).runs.get(id)),
      effects: await Promise.all(ids.map(effects)),
      claims: await Promise.all(ids.map((id) => claims(id, NAMES_REQUEST_SCOPE))),
      // One miss, the first round's: the second request EXECUTEs what the first prepared.
      misses: prepared.missCount,
    }).toEqual({
      answers: ids.map((id) => [201, { processed: id }]),
      runs: [1, 1],
      effects: [1, 1],
      claims: [[{ status: 'done', attempts: 1 }], [{ status: 'done', attempts: 1 }]],
      misses: 1,
    });
    const names = (await dataSource.query(`SELECT name FROM pg_prepared_statements WHERE name = $1`, [
      CLAIM_SQL.claimAtCommit!.name,
    ])) as { name: string }[];
    expect(names).toHaveLength(1);
  });
});
