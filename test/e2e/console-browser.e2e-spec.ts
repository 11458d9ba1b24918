import { copyFile, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Page } from 'playwright-core';
import request from 'supertest';
import { HandoffQueues, IdempotencyClaims, IdempotencyConsoleModule } from '../../lib/operator/index.js';
import {
  Breakage,
  CONSOLE_QUEUE,
  CONSOLE_TOKEN,
  ConsoleFixtureModule,
  OPERATOR_ROLE,
  OPERATOR_TOKEN,
  OperatorsGuard,
  SCOPES,
} from '../fixtures/console.fixture.js';
import { Gates } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { launchBrowser, type Browser } from '../support/browser.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { parkDelivery, type ParkedDelivery } from '../support/parked-delivery.js';
import { waitUntil } from '../support/wait-until.js';

/** The module's default maxAttempts: a claim is poison after that many failed deliveries. */
const MAX_ATTEMPTS = 5;
const CONSOLE_PATH = '/ops/idempotency';
/** `UPDATE_SCREENSHOTS=1`: the Express run writes its screenshots to docs/images/ for the docs. */
const DOCS_IMAGES = process.env.UPDATE_SCREENSHOTS === '1' ? 'docs/images' : undefined;

describe('the console refuses to boot without a token or a guard, or with a token that leaves it open', () => {
  it.each([
    [
      'no options',
      undefined,
      'it needs a token (forRoot({ token: process.env.CONSOLE_TOKEN })) or a guard of your own',
    ],
    ['neither token nor guard', {}, 'it needs a token'],
    // process.env.CONSOLE_TOKEN where it is not set: never `Bearer undefined` letting anyone in.
    [
      'an unset token',
      { token: undefined },
      'token is undefined: the variable it is read from is not set where the app runs',
    ],
    // A guard of one's own does not excuse a token asked for and unset.
    ['an unset token beside a guard', { token: undefined, guard: OperatorsGuard }, 'token is undefined'],
    ['an empty token', { token: '' }, 'token is empty'],
    ["the token 'undefined'", { token: 'undefined' }, 'token has 9 characters, fewer than 32'],
    ['a short token', { token: 'a'.repeat(31) }, 'token has 31 characters, fewer than 32'],
    [
      'a token with a line break',
      { token: `${CONSOLE_TOKEN}\n` },
      'token holds characters an Authorization header cannot carry',
    ],
    ['a token that is not a string', { token: 42 }, 'token must be a string, got number'],
    ['a guard that is not one', { guard: {} }, 'guard must be a CanActivate class or instance'],
    ['a path outside', { token: CONSOLE_TOKEN, path: '../x' }, 'path must be URL path segments'],
    ['an unknown option', { token: CONSOLE_TOKEN, limits: 5 }, 'option limits is unknown'],
  ])('%s', (_name, options, message) => {
    expect(() => IdempotencyConsoleModule.forRoot(options as never)).toThrow(
      `IdempotencyConsoleModule refuses to start: ${message}`,
    );
  });
});

describe.each(ADAPTERS)('the console in a real browser (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let browser: Browser;
  let page: Page;
  let screenshots: string;
  const parked: ParkedDelivery[] = [];
  const key = (name: string) => `evt_console_${name}_${adapter}`;
  const poisonKey = key('poison');
  const stuckKey = key('stuck');
  const jobKey = key('job');

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [ConsoleFixtureModule.forDatabase(db.url)]);
    // As a person opens it: the console's 401 makes the browser ask, and the token is the password.
    browser = await launchBrowser({ httpCredentials: { username: 'on-call', password: CONSOLE_TOKEN } });
    page = await browser.context.newPage();
    screenshots = await mkdtemp(join(tmpdir(), 'console-screenshots-'));
  });

  afterAll(async () => {
    running?.app.get(Gates).openAll();
    await Promise.all(parked.map((delivery) => delivery.answer));
    await browser?.close();
    await running?.close();
    await db?.drop();
    await rm(screenshots, { recursive: true, force: true });
  });

  const post = (path: string, body: object) =>
    request(running.url).post(`/console-fixture/${path}`).send(body);
  const claimRow = async (scope: string, eventKey: string) =>
    (
      await db.pool.query(
        'SELECT status, attempts FROM processed_events WHERE scope = $1 AND event_key = $2',
        [scope, eventKey],
      )
    ).rows[0] as { status: string; attempts: number } | undefined;

  /** A PNG of the page, kept in the run's directory (and docs/images/ when asked for). */
  async function screenshot(name: string): Promise<void> {
    const file = join(screenshots, `${name}.png`);
    await page.screenshot({ path: file, fullPage: true });
    const png = await readFile(file);
    expect(png.subarray(1, 4).toString()).toBe('PNG');
    if (DOCS_IMAGES && adapter === 'express') await copyFile(file, join(DOCS_IMAGES, `${name}.png`));
  }

  it('lists a poison event, a stuck lease and a dead-lettered job, with attempts, age and last error', async () => {
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      expect((await post('fail', { id: poisonKey })).status).toBe(500);
    }
    expect(await claimRow(SCOPES.fail, poisonKey)).toEqual({ status: 'failed', attempts: MAX_ATTEMPTS });
    parked.push(await parkDelivery(running, '/console-fixture/capture', { id: stuckKey }));
    running.app.get(Breakage).broken = true;
    expect((await post('enqueue', { id: jobKey })).status).toBe(200);
    const queues = running.app.get(HandoffQueues);
    await waitUntil(async () => (await queues.deadLetters()).length === 1, 'the job to be dead-lettered');

    await page.goto(`${running.url}${CONSOLE_PATH}`);
    const poison = page.locator(`#poison tr[data-key="${poisonKey}"]`);
    await poison.waitFor();
    expect(await poison.locator('td').nth(0).textContent()).toBe(SCOPES.fail);
    expect(await poison.locator('td').nth(3).textContent()).toBe(String(MAX_ATTEMPTS));
    expect(await poison.locator('td.error').textContent()).toBe(
      `the orders API refused ${poisonKey} (HTTP 422: missing customer)`,
    );
    const stuck = page.locator(`#in_progress tr[data-key="${stuckKey}"]`);
    expect(await stuck.locator('td').nth(0).textContent()).toBe(SCOPES.capture);
    // A live lease of two minutes: its age is seconds, its lease left about two minutes.
    expect(await stuck.locator('td').nth(5).textContent()).toMatch(/^(1|2) min$|^1\d\d s$/);
    const dead = page.locator('#dead-letters tr[data-job]');
    expect(await dead.count()).toBe(1);
    expect(await dead.locator('td').nth(1).textContent()).toBe(jobKey);
    expect(await dead.locator('td.error').textContent()).toBe(`the mail API is down (job for ${jobKey})`);
    await screenshot('console-overview');
  });

  it('releases a stuck lease behind a confirmation, and the next delivery runs', async () => {
    await page.goto(`${running.url}${CONSOLE_PATH}`);
    await page.locator(`#in_progress tr[data-key="${stuckKey}"] a`, { hasText: 'Release' }).click();
    await page.getByRole('button', { name: 'Release the lease' }).waitFor();
    // The confirmation names the claim and what releasing it does; nothing has changed yet.
    expect(await page.locator('.confirm dd').first().textContent()).toBe(SCOPES.capture);
    expect(await page.locator('.confirm').textContent()).toContain('its side effect may then run twice');
    expect(await claimRow(SCOPES.capture, stuckKey)).toEqual({ status: 'in_progress', attempts: 1 });
    await screenshot('console-confirm');

    await page.getByRole('button', { name: 'Release the lease' }).click();
    await page.waitForURL(/done=released/);
    expect(await page.locator('.notice.ok').textContent()).toBe(
      `Released ${stuckKey} (${SCOPES.capture}): its next delivery claims it.`,
    );
    expect(await claimRow(SCOPES.capture, stuckKey)).toEqual({ status: 'failed', attempts: 1 });
    expect(await page.locator(`#in_progress tr[data-key="${stuckKey}"]`).count()).toBe(0);
    await screenshot('console-released');

    // The sender's next delivery claims it at once (attempt 2) and runs the handler.
    const next = await post('capture', { id: stuckKey });
    expect(next.body).toEqual({ captured: stuckKey, attempt: 2 });
    expect(await claimRow(SCOPES.capture, stuckKey)).toEqual({ status: 'done', attempts: 2 });
    const calls = await db.pool.query('SELECT attempt FROM downstream_calls WHERE event_id = $1', [stuckKey]);
    expect(calls.rows).toEqual([{ attempt: 2 }]);
  });

  it('retries a dead-lettered job once its cause is fixed, and its worker runs it', async () => {
    running.app.get(Breakage).broken = false;
    await page.goto(`${running.url}${CONSOLE_PATH}`);
    const retry = page.locator('#dead-letters tr[data-job] a', { hasText: 'Retry' });
    // A second tab confirms the same retry, to be sent after this one.
    const second = await browser.context.newPage();
    await second.goto(new URL((await retry.getAttribute('href'))!, running.url).href);
    await retry.click();
    await page.getByRole('button', { name: 'Retry the job' }).click();
    await page.waitForURL(/done=retried/);
    expect(await page.locator('.notice.ok').textContent()).toMatch(
      new RegExp(`^Queued [0-9a-f-]{36} \\(${CONSOLE_QUEUE}\\) again as job [0-9a-f-]{36}\\.$`),
    );
    await waitUntil(
      async () =>
        (await db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [
          `worker:${jobKey}`,
        ])) === 1,
      'the retried job to run',
    );
    expect(await running.app.get(HandoffQueues).deadLetters()).toEqual([]);
    // Asking again changes nothing: the dead letter is gone, and the job ran once.
    await second.getByRole('button', { name: 'Retry the job' }).click();
    await second.waitForURL(/done=refused/);
    expect(await second.locator('.notice.refused').textContent()).toContain('it is not there (any more)');
    await second.close();
    expect(
      await db.count('SELECT count(*) FROM downstream_calls WHERE event_id = $1', [`worker:${jobKey}`]),
    ).toBe(1);
  });

  it('forgets a poison event behind a confirmation', async () => {
    await page.goto(`${running.url}${CONSOLE_PATH}`);
    await page.locator(`#poison tr[data-key="${poisonKey}"] a`, { hasText: 'Forget' }).click();
    await page.getByRole('button', { name: 'Forget the claim' }).click();
    await page.waitForURL(/done=forgotten/);
    expect(await claimRow(SCOPES.fail, poisonKey)).toBeUndefined();
    expect(await page.locator(`#poison tr[data-key="${poisonKey}"]`).count()).toBe(0);
  });

  it('refuses a form without the console token, from another site, or past the guard, and changes nothing', async () => {
    const fresh = key('csrf');
    parked.push(await parkDelivery(running, '/console-fixture/capture', { id: fresh }));
    const claims = running.app.get(IdempotencyClaims);
    const release = (headers: Record<string, string>, body: string) =>
      request(running.url)
        .post(`${CONSOLE_PATH}/actions/release`)
        .set({
          authorization: OPERATOR_TOKEN,
          'content-type': 'application/x-www-form-urlencoded',
          ...headers,
        })
        .send(body);
    const form = new URLSearchParams({ scope: SCOPES.capture, key: fresh });

    // What the refusal page says, as text.
    const said = (html: string) =>
      /<div class="confirm"><h2>[^<]*<\/h2><p>([^<]*)<\/p>/.exec(html)?.[1]?.replaceAll('&#39;', "'");
    const noToken = await release({}, form.toString());
    expect(noToken.status).toBe(403);
    expect(said(noToken.text)).toBe(
      'The action was refused: the browser sent no console token (its cookie is missing). Reload the console and try again.',
    );
    const token = 'a'.repeat(43);
    const mismatched = await release(
      { cookie: `idempotency_console_csrf=${token}` },
      `${form}&_csrf=${'b'.repeat(43)}`,
    );
    expect(mismatched.status).toBe(403);
    expect(said(mismatched.text)).toContain("the form's console token is not this browser's");
    const crossSite = await release(
      { cookie: `idempotency_console_csrf=${token}`, 'sec-fetch-site': 'cross-site' },
      `${form}&_csrf=${token}`,
    );
    expect(crossSite.status).toBe(403);
    expect(said(crossSite.text)).toContain(
      'the form was sent from another site (Sec-Fetch-Site: cross-site)',
    );
    const otherOrigin = await release(
      { cookie: `idempotency_console_csrf=${token}`, origin: 'https://evil.example' },
      `${form}&_csrf=${token}`,
    );
    expect(otherOrigin.status).toBe(403);
    expect(said(otherOrigin.text)).toContain(
      'the form was sent from https://evil.example, not from this console',
    );
    expect((await claims.show(SCOPES.capture, fresh))?.status).toBe('in_progress');

    // Without the token nothing is served at all.
    const unauthenticated = await request(running.url).get(CONSOLE_PATH);
    expect(unauthenticated.status).toBe(401);
    expect(unauthenticated.text).not.toContain(fresh);
    const answer = await request(running.url).get(CONSOLE_PATH).set({ authorization: OPERATOR_TOKEN });
    expect(answer.headers['content-security-policy']).toContain("default-src 'none'");
    expect(answer.headers['x-frame-options']).toBe('DENY');
  });

  it('answers 401 to a missing or wrong token, `Bearer undefined` included, and lists and releases nothing', async () => {
    const fresh = key('token');
    parked.push(await parkDelivery(running, '/console-fixture/capture', { id: fresh }));
    const basic = (credentials: string) => `Basic ${Buffer.from(credentials).toString('base64')}`;
    // A confirmation page, with the right token: its cookie and form token are what a thief lacks least.
    const confirm = await request(running.url)
      .get(`${CONSOLE_PATH}/confirm`)
      .query({ action: 'release', scope: SCOPES.capture, key: fresh })
      .set({ authorization: OPERATOR_TOKEN });
    expect(confirm.status).toBe(200);
    const cookie = String(confirm.headers['set-cookie']).split(';')[0]!;
    const csrf = /name="_csrf" value="([^"]+)"/.exec(confirm.text)![1]!;
    const form = new URLSearchParams({ scope: SCOPES.capture, key: fresh, _csrf: csrf }).toString();

    const refused: (string | undefined)[] = [
      undefined,
      'Bearer undefined',
      'Bearer ',
      `Bearer ${CONSOLE_TOKEN.slice(0, -1)}`,
      `Bearer ${CONSOLE_TOKEN}x`,
      `Token ${CONSOLE_TOKEN}`,
      CONSOLE_TOKEN,
      basic('on-call:wrong'),
      basic(CONSOLE_TOKEN), // no user name: no password
      basic(`${CONSOLE_TOKEN}:`),
    ];
    for (const authorization of refused) {
      const headers = authorization === undefined ? {} : { authorization };
      const list = await request(running.url).get(CONSOLE_PATH).set(headers);
      expect({ authorization, status: list.status }).toEqual({ authorization, status: 401 });
      expect(list.headers['www-authenticate']).toMatch(/^Basic realm="idempotency console"/);
      expect(list.text).not.toContain(fresh);
      const release = await request(running.url)
        .post(`${CONSOLE_PATH}/actions/release`)
        .set({ ...headers, cookie, 'content-type': 'application/x-www-form-urlencoded' })
        .send(form);
      expect({ authorization, status: release.status }).toEqual({ authorization, status: 401 });
    }
    expect(await claimRow(SCOPES.capture, fresh)).toEqual({ status: 'in_progress', attempts: 1 });

    // The token, as a script sends it (any case of the scheme) or as a browser's sign-in does.
    for (const authorization of [`bearer ${CONSOLE_TOKEN}`, basic(`anyone:${CONSOLE_TOKEN}`)]) {
      const list = await request(running.url).get(CONSOLE_PATH).set({ authorization });
      expect({ authorization, status: list.status }).toEqual({ authorization, status: 200 });
      expect(list.text).toContain(fresh);
    }
  });
});

describe.each([
  ['a guard of its own (an SSO set-up)', { guard: OperatorsGuard }],
  ['the token and a guard', { token: CONSOLE_TOKEN, guard: OperatorsGuard }],
] as const)('the console behind %s', (_name, options) => {
  let db: TestDatabase;
  let running: RunningApp;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp('fastify', [ConsoleFixtureModule.forDatabase(db.url, options)]);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  it('serves only what passes every check it was given', async () => {
    const get = (headers: Record<string, string>) => request(running.url).get(CONSOLE_PATH).set(headers);
    const both = { ...OPERATOR_ROLE, authorization: OPERATOR_TOKEN };
    expect((await get(both)).status).toBe(200);
    // The app's guard refuses as Nest does, 403.
    expect((await get({ authorization: OPERATOR_TOKEN })).status).toBe(403);
    const roleOnly = await get(OPERATOR_ROLE);
    expect(roleOnly.status).toBe('token' in options ? 401 : 200);
  });
});
