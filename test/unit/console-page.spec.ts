import { describe, expect, it } from '@jest/globals';
import { csrfRefusal, csrfToken, CSRF_COOKIE } from '../../lib/console/console-csrf.js';
import { renderConfirmPage, renderConsolePage } from '../../lib/console/console-page.renderer.js';
import type { ClaimRecord } from '../../lib/operator/index.js';

/** A claim whose every text is markup: an event key and an error come from outside. */
const hostile: ClaimRecord = {
  scope: 'Orders.<b>handle</b>',
  key: 'evt_"><script>alert(1)</script>',
  source: 'stripe',
  status: 'failed',
  poison: true,
  attempts: 5,
  leaseToken: null,
  claimedAt: new Date('2026-12-01T10:00:00Z'),
  leaseExpiresAt: null,
  completedAt: null,
  ageMs: 90_000,
  leaseLeftMs: null,
  lastError: '<img src=x onerror=alert(2)>',
};

describe('the console page', () => {
  it('escapes every text it shows, in elements and attributes', () => {
    const html = renderConsolePage({
      title: 'Console <x>',
      base: '/ops',
      sections: [{ status: 'poison', claims: [hostile] }],
      limit: 50,
    });
    expect(html).not.toContain('<script>');
    expect(html).not.toContain('<img');
    expect(html).not.toContain('<b>handle');
    expect(html).toContain('evt_&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;');
    expect(html).toContain('&lt;img src=x onerror=alert(2)&gt;');
    // The action link carries scope and key URL-encoded, then escaped for the attribute.
    expect(html).toContain(
      'href="/ops/confirm?action=forget&amp;scope=Orders.%3Cb%3Ehandle%3C%2Fb%3E&amp;key=evt_%22%3E%3Cscript%3Ealert%281%29%3C%2Fscript%3E"',
    );
    expect(html).toContain('<td class="num" title="2026-12-01T10:00:00.000Z">2 min</td>');
  });

  it('puts the token and the fields in the confirmation form, escaped', () => {
    const html = renderConfirmPage({
      title: 'Console',
      base: '/ops',
      token: 'T'.repeat(43),
      action: 'forget',
      claim: hostile,
      fields: { scope: hostile.scope, key: hostile.key },
    });
    expect(html).toContain('<form method="post" action="/ops/actions/forget">');
    expect(html).toContain(`<input type="hidden" name="_csrf" value="${'T'.repeat(43)}">`);
    expect(html).toContain(
      '<input type="hidden" name="key" value="evt_&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;">',
    );
    expect(html).not.toContain('<script>');
  });
});

describe("the console's CSRF checks", () => {
  const token = 'a'.repeat(43);
  const cookie = `other=1; ${CSRF_COOKIE}=${token}`;

  it('issues an HttpOnly, SameSite=Strict cookie for the console path once, then reuses it', () => {
    const issued = csrfToken({}, '/ops/idempotency', true);
    expect(issued.token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(issued.setCookie).toBe(
      `${CSRF_COOKIE}=${issued.token}; Path=/ops/idempotency; HttpOnly; SameSite=Strict; Secure`,
    );
    expect(csrfToken({ cookie }, '/ops/idempotency', false)).toEqual({ token });
  });

  it.each([
    [{ cookie }, token, undefined],
    [
      { cookie, 'sec-fetch-site': 'same-origin', origin: 'http://app:3000', host: 'app:3000' },
      token,
      undefined,
    ],
    [
      { cookie, origin: 'https://app.example', host: 'internal:3000', 'x-forwarded-host': 'app.example' },
      token,
      undefined,
    ],
    [{}, token, 'the browser sent no console token (its cookie is missing)'],
    [{ cookie }, undefined, 'the form carries no console token'],
    [{ cookie }, 'b'.repeat(43), "the form's console token is not this browser's"],
    [
      { cookie, 'sec-fetch-site': 'same-site' },
      token,
      'the form was sent from another site (Sec-Fetch-Site: same-site)',
    ],
    [
      { cookie, origin: 'http://evil:3000', host: 'app:3000' },
      token,
      'the form was sent from http://evil:3000, not from this console',
    ],
  ])('%j with %s: %s', (headers, submitted, refusal) => {
    expect(csrfRefusal(headers, submitted)).toBe(refusal);
  });
});
