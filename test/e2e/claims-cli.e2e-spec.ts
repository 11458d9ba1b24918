import { readFileSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { claimTable } from '../../lib/postgres/claim-table.js';
import { createClaimTableSql } from '../../lib/postgres/schema.sql.js';
import { IdempotencyClaims } from '../../lib/operator/index.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { startApp, type RunningApp } from '../support/app.js';
import { parkRun, runDelivery, type ParkedRun } from '../support/claim-runs.js';
import { CLI_ENTRY, runClaimsCli } from '../support/claims-cli.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { claimRow, downstreamCalls } from '../support/lease-rows.js';
import { freePort } from '../support/postgres-server.js';
import { releasedByOperator } from '../../lib/operator/claims.operator.js';

/** As the CLI's --max-attempts and the app's maxAttempts: two failures make a poison claim. */
const MAX_ATTEMPTS = 2;

/**
 * `nest-idempotent-webhooks claims ...` as a real child process (node on the built file that
 * package.json's `bin` names) against the test database, on claims real deliveries made through a
 * real app: what it prints, what it changes in the table, what the next delivery then does, and
 * its exit codes.
 */
describe('nest-idempotent-webhooks claims (CLI)', () => {
  let db: TestDatabase;
  let running: RunningApp;
  const parked: ParkedRun[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp('express', [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        idempotency: { reporter: false, maxAttempts: MAX_ATTEMPTS },
      }),
    ]);
  });

  afterEach(async () => {
    const runs = parked.splice(0);
    for (const run of runs) run.open();
    await Promise.all(runs.map((run) => run.result));
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const deliver = (scope: string, key: string, behaviour?: { fail?: boolean }) =>
    runDelivery(running.app, scope, key, behaviour);
  const park = async (scope: string, key: string) => {
    const run = await parkRun(running.app, scope, key);
    parked.push(run);
    return run;
  };
  const failTimes = async (scope: string, key: string, times: number) => {
    for (let attempt = 1; attempt <= times; attempt++) {
      await expect(deliver(scope, key, { fail: true })).rejects.toThrow('failed on purpose');
    }
  };
  const cli = (...args: string[]) => runClaimsCli(args, { DATABASE_URL: db.url });
  const json = (stdout: string) => JSON.parse(stdout);

  it('is the bin package.json names, a node script', () => {
    expect(readFileSync(CLI_ENTRY, 'utf8').split('\n')[0]).toBe('#!/usr/bin/env node');
  });

  it('lists claims as a table and as JSON, by status, scope, age and limit', async () => {
    const scope = 'Cli.list';
    await deliver(scope, 'done');
    await failTimes(scope, 'failed', 1);
    await failTimes(scope, 'poison', MAX_ATTEMPTS);
    await park(scope, 'live');

    const table = await cli('claims', 'list', '--scope', scope, '--max-attempts', String(MAX_ATTEMPTS));
    expect(table).toMatchObject({ code: 0, stderr: '' });
    const lines = table.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^SCOPE\s+KEY\s+STATUS\s+ATTEMPTS\s+AGE\s+LEASE LEFT\s+LAST ERROR$/);
    expect(lines.slice(1, -1).map((line) => line.split(/\s{2,}/).slice(0, 4))).toEqual([
      [scope, 'live', 'in_progress', '1'],
      [scope, 'poison', 'failed (poison)', String(MAX_ATTEMPTS)],
      [scope, 'failed', 'failed', '1'],
      [scope, 'done', 'done', '1'],
    ]);
    // The live lease shows what is left of it (the default 5 minutes); the failures their error.
    expect(lines[1]).toMatch(/\s4m \d+s\s*$|\s5m 0s\s*$/);
    expect(lines[2]).toContain('poison failed on purpose');
    expect(lines.at(-1)).toBe('4 claims');

    const listed = await cli(
      'claims',
      'list',
      '--scope',
      scope,
      '--max-attempts',
      String(MAX_ATTEMPTS),
      '--json',
    );
    expect(listed.code).toBe(0);
    const fromService = await running.app.get(IdempotencyClaims).list({ scope });
    // Ages move between the two reads; everything else must be the same.
    const stable = (record: Record<string, unknown>) => ({ ...record, ageMs: 0, leaseLeftMs: 0 });
    expect(json(listed.stdout).map(stable)).toEqual(json(JSON.stringify(fromService)).map(stable));

    const keysOf = async (...args: string[]) => {
      const run = await cli('claims', 'list', '--scope', scope, '--json', ...args);
      expect(run).toMatchObject({ code: 0, stderr: '' });
      return json(run.stdout).map((record: { key: string }) => record.key);
    };
    expect(await keysOf('--status', 'in_progress')).toEqual(['live']);
    expect(await keysOf('--status', 'failed')).toEqual(['poison', 'failed']);
    // Poison follows --max-attempts: the module's maxAttempts, 5 unless given.
    expect(await keysOf('--status', 'poison', '--max-attempts', '2')).toEqual(['poison']);
    expect(await keysOf('--status', 'poison')).toEqual([]);
    expect(await keysOf('--status', 'done')).toEqual(['done']);
    expect(await keysOf('--status', 'expired')).toEqual([]);
    expect(await keysOf('--limit', '2')).toEqual(['live', 'poison']);

    await db.pool.query(
      `UPDATE processed_events SET claimed_at = now() - interval '2 hours' WHERE scope = $1 AND event_key = 'failed'`,
      [scope],
    );
    expect(await keysOf('--older-than', '90m')).toEqual(['failed']);
    expect(await keysOf('--older-than=1h', '--status', 'failed')).toEqual(['failed']);
    expect(await keysOf('--older-than', '3h')).toEqual([]);

    const limited = await cli('claims', 'list', '--scope', scope, '--limit', '1');
    expect(limited.stdout.trimEnd().split('\n')).toHaveLength(3);
    expect(limited.stdout).toContain('1 claims (the limit; --limit to see more)');
    expect((await cli('claims', 'list', '--scope', 'Cli.nothing-here')).stdout).toBe('No claims.\n');
  });

  it('shows one claim, and answers 1 for a claim that does not exist', async () => {
    const scope = 'Cli.show';
    await failTimes(scope, 'failed', 1);
    const shown = await cli('claims', 'show', scope, 'failed');
    expect(shown).toMatchObject({ code: 0, stderr: '' });
    expect(shown.stdout).toMatch(new RegExp(`^scope\\s+${scope.replace('.', '\\.')}$`, 'm'));
    expect(shown.stdout).toMatch(/^status\s+failed$/m);
    expect(shown.stdout).toMatch(/^attempts\s+1$/m);
    expect(shown.stdout).toMatch(/^last error\s+failed failed on purpose$/m);
    // A failed attempt keeps its token (a resent failure mark recognises itself by it).
    expect(shown.stdout).toMatch(/^lease token\s+[0-9a-f-]{36}$/m);

    const asJson = await cli('claims', 'show', scope, 'failed', '--json');
    expect(asJson.code).toBe(0);
    const record = json(asJson.stdout);
    const expected = await running.app.get(IdempotencyClaims).show(scope, 'failed');
    expect({ ...record, ageMs: 0 }).toEqual({ ...json(JSON.stringify(expected)), ageMs: 0 });

    const missing = await cli('claims', 'show', scope, 'never-delivered');
    expect(missing).toMatchObject({ code: 1, stdout: '' });
    expect(missing.stderr).toContain(`no claim of ${scope} key never-delivered`);
    expect(await cli('claims', 'show', scope, 'never-delivered', '--json')).toMatchObject({
      code: 1,
      stdout: 'null\n',
    });
  });

  it('releases a live lease: the next delivery claims it at once; done and failed claims are refused', async () => {
    const scope = 'Cli.release';
    const holder = await park(scope, 'stuck');
    const released = await cli('claims', 'release', scope, 'stuck');
    expect(released).toMatchObject({ code: 0, stderr: '' });
    expect(released.stdout).toContain(`released ${scope} key stuck (attempt 1): its lease was still live`);
    expect(await claimRow(db, scope, 'stuck')).toMatchObject({
      status: 'failed',
      lease_token: null,
      last_error: releasedByOperator(),
    });

    // The next delivery does not wait out the 5-minute lease.
    expect(await deliver(scope, 'stuck')).toBe(2);
    expect(await downstreamCalls(db, 'stuck')).toEqual([{ attempt: 2 }]);
    holder.open();
    await holder.result;
    expect(await claimRow(db, scope, 'stuck')).toMatchObject({ status: 'done', attempts: 2 });

    const ofDone = await cli('claims', 'release', scope, 'stuck');
    expect(ofDone).toMatchObject({ code: 1, stdout: '' });
    expect(ofDone.stderr).toContain(`${scope} key stuck is done: there is no lease to release`);

    await failTimes(scope, 'failed', 1);
    const before = await claimRow(db, scope, 'failed');
    const ofFailed = await cli('claims', 'release', scope, 'failed', '--json');
    expect(ofFailed.code).toBe(1);
    expect(json(ofFailed.stdout)).toMatchObject({ released: false, refusal: { reason: 'failed' } });
    expect(await claimRow(db, scope, 'failed')).toEqual(before);

    await park(scope, 'as-json');
    const asJson = await cli('claims', 'release', scope, 'as-json', '--json');
    expect(asJson.code).toBe(0);
    expect(json(asJson.stdout)).toMatchObject({
      released: true,
      leaseWasLive: true,
      claim: { key: 'as-json', status: 'failed', leaseToken: null },
    });
    expect((await cli('claims', 'release', scope, 'unknown')).code).toBe(1);
  });

  it('forgets a done key only with --force: the next delivery processes the event again', async () => {
    const scope = 'Cli.forget';
    expect(await deliver(scope, 'evt_cli_forget')).toBe(1);
    expect(await deliver(scope, 'evt_cli_forget')).toBe('replayed');

    const unforced = await cli('claims', 'forget', scope, 'evt_cli_forget');
    expect(unforced).toMatchObject({ code: 1, stdout: '' });
    expect(unforced.stderr).toContain('--force');
    expect(await claimRow(db, scope, 'evt_cli_forget')).toMatchObject({ status: 'done' });

    const forced = await cli('claims', 'forget', scope, 'evt_cli_forget', '--force');
    expect(forced).toMatchObject({ code: 0, stderr: '' });
    expect(forced.stdout).toContain(`forgot ${scope} key evt_cli_forget (done after 1 attempt)`);
    expect(await claimRow(db, scope, 'evt_cli_forget')).toBeUndefined();
    expect(await deliver(scope, 'evt_cli_forget')).toBe(1);
    expect(await downstreamCalls(db, 'evt_cli_forget')).toEqual([{ attempt: 1 }, { attempt: 1 }]);

    await park(scope, 'live');
    const ofLive = await cli('claims', 'forget', scope, 'live', '--force');
    expect(ofLive).toMatchObject({ code: 1, stdout: '' });
    expect(ofLive.stderr).toContain(`${scope} key live is being processed`);
    expect(await claimRow(db, scope, 'live')).toMatchObject({ status: 'in_progress' });

    await failTimes(scope, 'failed', 1);
    const asJson = await cli('claims', 'forget', scope, 'failed', '--force', '--json');
    expect(asJson.code).toBe(0);
    expect(json(asJson.stdout)).toMatchObject({
      forgotten: true,
      claim: { key: 'failed', status: 'failed' },
    });
    expect(await claimRow(db, scope, 'failed')).toBeUndefined();
  });

  it('finds the table the --schema and --table options name', async () => {
    const table = claimTable('ops', 'webhook_claims');
    for (const statement of createClaimTableSql(table)) await db.pool.query(statement);
    await db.pool.query(
      `INSERT INTO ${table.sql} (scope, event_key, source, status, attempts, last_error)
       VALUES ('Ops.moved', 'k1', 'seed', 'failed', 1, 'boom')`,
    );
    const moved = await cli('claims', 'list', '--schema', 'ops', '--table', 'webhook_claims', '--json');
    expect(json(moved.stdout)).toEqual([
      expect.objectContaining({ scope: 'Ops.moved', key: 'k1', poison: false }),
    ]);
    const poison = await cli(
      'claims',
      'list',
      '--schema',
      'ops',
      '--table',
      'webhook_claims',
      '--status',
      'poison',
      '--max-attempts',
      '1',
      '--json',
    );
    expect(json(poison.stdout)).toEqual([expect.objectContaining({ key: 'k1', poison: true })]);
    expect((await cli('claims', 'show', 'Ops.moved', 'k1')).code).toBe(1);

    const wrong = await cli('claims', 'list', '--table', 'no_such_table');
    expect(wrong).toMatchObject({ code: 3, stdout: '' });
    expect(wrong.stderr).toContain('the claims table "no_such_table" does not exist in this database');
  });

  it('answers usage errors with 2 and a message, --help with 0, and a database it cannot reach with 3', async () => {
    const usage: [string[], string][] = [
      [[], 'No command given'],
      [['claims'], 'claims needs a command'],
      [['bogus'], "Unknown command 'bogus'"],
      [['claims', 'bogus'], "Unknown command 'claims bogus'"],
      [['claims', 'lst'], "Unknown command 'claims lst'; did you mean 'claims list'?"],
      [['list'], "Unknown command 'list'; did you mean 'claims list'?"],
      [['claims', 'list', '--stauts', 'failed'], "Unknown option '--stauts'; did you mean --status?"],
      [['claims', 'list', '--status', 'stuck'], '--status must be one of'],
      [['claims', 'list', '--older-than', '10'], '--older-than must be a number and a unit'],
      [['claims', 'list', '--limit', '0'], '--limit must be a whole number'],
      [['claims', 'list', '--max-attempts', 'many'], '--max-attempts must be a whole number'],
      [['claims', 'list', '--nope'], "Unknown option '--nope'"],
      [['claims', 'list', 'extra'], "claims list takes no arguments, got 'extra'"],
      [['claims', 'show', 'only-a-scope'], 'claims show needs <scope> <key>'],
      [['claims', 'show', '', 'key'], '<scope> is empty'],
      [['claims', 'release', 'scope', 'key', '--force'], 'claims release takes no --force'],
      [['claims', 'forget', 'scope', 'key', '--status', 'done'], 'claims forget takes no --status'],
      [['claims', 'list', '--table', ''], 'option table must be a non-empty string'],
    ];
    // Independent runs, side by side: each starts a node process.
    const runs = await Promise.all(usage.map(([args]) => cli(...args)));
    for (const [index, [args, message]] of usage.entries()) {
      const run = runs[index];
      expect({ args, code: run.code, stdout: run.stdout }).toEqual({ args, code: 2, stdout: '' });
      expect(run.stderr).toContain(message);
      expect(run.stderr).toContain('claims --help');
    }

    const noUrl = await runClaimsCli(['claims', 'list'], { DATABASE_URL: undefined });
    expect(noUrl).toMatchObject({ code: 2, stdout: '' });
    expect(noUrl.stderr).toContain('DATABASE_URL is not set');

    for (const args of [['--help'], ['claims', 'list', '-h']]) {
      const help = await runClaimsCli(args, { DATABASE_URL: undefined });
      expect(help).toMatchObject({ code: 0, stderr: '' });
      expect(help.stdout).toContain('Usage: nest-idempotent-webhooks claims <command>');
      expect(help.stdout).toContain('claims forget <scope> <key> --force');
    }

    const closed = new URL(db.url);
    closed.port = String(await freePort());
    const unreachable = await runClaimsCli(['claims', 'list'], { DATABASE_URL: closed.toString() });
    expect(unreachable).toMatchObject({ code: 3, stdout: '' });
    expect(unreachable.stderr).toContain('claims list failed: connect ECONNREFUSED');
  });
});
