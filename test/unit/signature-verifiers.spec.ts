import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from '@jest/globals';
import { Webhook } from 'standardwebhooks';
import Stripe from 'stripe';
import { verifyGithubSignature } from '../../lib/guards/github-signature.guard.js';
import { verifyShopifySignature } from '../../lib/guards/shopify-signature.guard.js';
import { decodeBase64, digestsEqual } from '../../lib/guards/signature-crypto.js';
import { standardWebhooksKey } from '../../lib/guards/signature-options.js';
import { verifyStandardWebhook } from '../../lib/guards/standard-webhooks-signature.guard.js';
import { verifyStripeSignature } from '../../lib/guards/stripe-signature.guard.js';
import { WebhookSignatureError, type SignatureFailure } from '../../lib/guards/webhook-signature.error.js';
import {
  githubSignature,
  shopifySignature,
  standardWebhookHeaders,
  standardWebhookSecret,
} from '../support/webhook-signers.js';

/** The WebhookSignatureError `verify` throws, as `{ failure, header, message }`. */
function refusal(verify: () => unknown): { failure: SignatureFailure; header: string; message: string } {
  try {
    verify();
  } catch (error) {
    if (error instanceof WebhookSignatureError) {
      return { failure: error.failure, header: error.header, message: error.message };
    }
    throw error;
  }
  throw new Error('the signature was accepted, but it should have been refused');
}

const body = (text: string) => Buffer.from(text, 'utf8');

describe('GitHub: X-Hub-Signature-256', () => {
  // GitHub's documented test vector ("Validating webhook deliveries").
  const secret = "It's a Secret to Everybody";
  const payload = 'Hello, World!';
  const vector = 'sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17';

  it('accepts the documented test vector, and the tests sign other bodies the same way', () => {
    expect(() => verifyGithubSignature(body(payload), vector, [secret])).not.toThrow();
    expect(githubSignature(payload, secret)).toBe(vector);
    // GitHub sends lower-case hex; upper-case is the same digest.
    expect(() =>
      verifyGithubSignature(body(payload), vector.toUpperCase().replace('SHA256', 'sha256'), [secret]),
    ).not.toThrow();
  });

  it('passes a delivery signed with any of the configured secrets (rotation)', () => {
    expect(() => verifyGithubSignature(body(payload), vector, ['the next secret', secret])).not.toThrow();
  });

  it('refuses another body, another secret, or one changed digit: mismatch', () => {
    const flipped = vector.slice(0, -1) + (vector.endsWith('7') ? '8' : '7');
    for (const [raw, header, secrets] of [
      [body('Hello, World?'), vector, [secret]],
      [body(payload), vector, ['another secret']],
      [body(payload), flipped, [secret]],
    ] as const) {
      expect(refusal(() => verifyGithubSignature(raw, header, secrets))).toEqual({
        failure: 'mismatch',
        header: 'X-Hub-Signature-256',
        message:
          'X-Hub-Signature-256 does not match the raw request body; was it signed with another secret, or the body changed on the way?',
      });
    }
  });

  it.each([
    ['the SHA-1 header format', 'sha1=01a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4'],
    ['no sha256= prefix', vector.slice('sha256='.length)],
    ['a short digest', vector.slice(0, -2)],
    ['non-hex digits', vector.slice(0, -1) + 'g'],
  ])('refuses %s as malformed', (_case, header) => {
    expect(refusal(() => verifyGithubSignature(body(payload), header, [secret]))).toEqual({
      failure: 'malformed',
      header: 'X-Hub-Signature-256',
      message: 'X-Hub-Signature-256 header is malformed: expected sha256= followed by 64 hexadecimal digits',
    });
  });

  it('refuses a missing, empty or repeated header', () => {
    expect(refusal(() => verifyGithubSignature(body(payload), undefined, [secret]))).toMatchObject({
      failure: 'missing',
      message: 'X-Hub-Signature-256 header is missing',
    });
    expect(refusal(() => verifyGithubSignature(body(payload), '', [secret]))).toMatchObject({
      failure: 'missing',
      message: 'X-Hub-Signature-256 header is empty',
    });
    expect(refusal(() => verifyGithubSignature(body(payload), [vector, vector], [secret]))).toMatchObject({
      failure: 'malformed',
      message: 'X-Hub-Signature-256 header is sent more than once',
    });
  });
});

describe('Shopify: X-Shopify-Hmac-Sha256', () => {
  const secret = 'shopify-app-client-secret';
  const payload = JSON.stringify({ id: 820982911946154500, email: 'jon@example.com' });

  it('accepts the base64 HMAC-SHA256 of the raw body, under any configured secret', () => {
    const header = shopifySignature(payload, secret);
    expect(() => verifyShopifySignature(body(payload), header, [secret])).not.toThrow();
    expect(() => verifyShopifySignature(body(payload), header, ['old secret', secret])).not.toThrow();
  });

  it('refuses re-serialised JSON: the raw bytes are what Shopify signed', () => {
    const header = shopifySignature(payload, secret);
    const reserialised = JSON.stringify(JSON.parse(payload), null, 2);
    expect(refusal(() => verifyShopifySignature(body(reserialised), header, [secret])).failure).toBe(
      'mismatch',
    );
  });

  it('refuses another secret as a mismatch naming the header', () => {
    const header = shopifySignature(payload, 'another secret');
    expect(refusal(() => verifyShopifySignature(body(payload), header, [secret]))).toEqual({
      failure: 'mismatch',
      header: 'X-Shopify-Hmac-Sha256',
      message:
        'X-Shopify-Hmac-Sha256 does not match the raw request body; was it signed with another secret, or the body changed on the way?',
    });
  });

  it.each([
    ['not base64', 'not base64!'],
    ['a hex digest', 'a'.repeat(64)],
    ['base64 of 16 bytes', Buffer.alloc(16).toString('base64')],
  ])('refuses %s as malformed', (_case, header) => {
    expect(refusal(() => verifyShopifySignature(body(payload), header, [secret]))).toEqual({
      failure: 'malformed',
      header: 'X-Shopify-Hmac-Sha256',
      message: 'X-Shopify-Hmac-Sha256 header is malformed: expected the base64 of a 32-byte HMAC-SHA256',
    });
  });
});

describe('Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature', () => {
  const secret = standardWebhookSecret('unit-current');
  const key = standardWebhooksKey(secret);
  const payload = JSON.stringify({ type: 'user.created', data: { id: 'user_1' } });
  const now = Math.floor(Date.now() / 1000);
  const signedAt = (seconds: number) => new Date(seconds * 1000);
  const headersOf = (signed: Record<string, string>) => ({
    id: signed['webhook-id'],
    timestamp: signed['webhook-timestamp'],
    signature: signed['webhook-signature'],
  });

  it("accepts what the standardwebhooks SDK signs, as the SDK's own verify does", () => {
    const signed = standardWebhookHeaders('msg_1', payload, secret, signedAt(now));
    expect(() => verifyStandardWebhook(body(payload), headersOf(signed), [key], 300, now)).not.toThrow();
    expect(new Webhook(secret).verify(payload, signed)).toEqual(JSON.parse(payload));
  });

  it('reads the secret with or without its whsec_ prefix, as the SDK does', () => {
    expect(standardWebhooksKey(secret.slice('whsec_'.length))).toEqual(key);
    expect(key).toEqual(Buffer.from('unit-current'.padEnd(32, '.')));
  });

  it('passes when any v1 entry matches any key (the sender rotating, or the receiver)', () => {
    const signed = standardWebhookHeaders('msg_2', payload, secret, signedAt(now));
    const other = new Webhook(standardWebhookSecret('unit-other')).sign('msg_2', signedAt(now), payload);
    const headers = {
      ...headersOf(signed),
      signature: `${other} v1a,c2lnbmVkIGJ5IGVkMjU1MTk= ${signed['webhook-signature']}`,
    };
    expect(() => verifyStandardWebhook(body(payload), headers, [key], 300, now)).not.toThrow();
    const otherKey = standardWebhooksKey(standardWebhookSecret('unit-other'));
    expect(() =>
      verifyStandardWebhook(body(payload), headersOf(signed), [otherKey, key], 300, now),
    ).not.toThrow();
  });

  it('signs the id and the timestamp too: changing either is a mismatch on webhook-signature', () => {
    const signed = headersOf(standardWebhookHeaders('msg_3', payload, secret, signedAt(now)));
    for (const changed of [
      { ...signed, id: 'msg_4' },
      { ...signed, timestamp: String(now - 1) },
    ]) {
      expect(refusal(() => verifyStandardWebhook(body(payload), changed, [key], 300, now))).toEqual({
        failure: 'mismatch',
        header: 'webhook-signature',
        message:
          'webhook-signature does not match webhook-id, webhook-timestamp and the raw request body; was it signed with another secret, or the body changed on the way?',
      });
    }
  });

  it('enforces the tolerance both ways, naming webhook-timestamp, and accepts its edge', () => {
    const at = (seconds: number) =>
      headersOf(standardWebhookHeaders('msg_5', payload, secret, signedAt(seconds)));
    expect(() => verifyStandardWebhook(body(payload), at(now - 300), [key], 300, now)).not.toThrow();
    expect(() => verifyStandardWebhook(body(payload), at(now + 300), [key], 300, now)).not.toThrow();
    expect(refusal(() => verifyStandardWebhook(body(payload), at(now - 301), [key], 300, now))).toEqual({
      failure: 'stale',
      header: 'webhook-timestamp',
      message:
        'webhook-timestamp is 301 s old, more than the tolerance of 300 s: refused as a possible replay',
    });
    expect(refusal(() => verifyStandardWebhook(body(payload), at(now + 301), [key], 300, now))).toEqual({
      failure: 'stale',
      header: 'webhook-timestamp',
      message:
        "webhook-timestamp is 301 s in the future, more than the tolerance of 300 s: check the server's clock",
    });
    expect(() => verifyStandardWebhook(body(payload), at(now - 3_000), [key], 3_600, now)).not.toThrow();
    expect(refusal(() => verifyStandardWebhook(body(payload), at(now + 3_600), [key], 300, now))).toEqual({
      failure: 'stale',
      header: 'webhook-timestamp',
      message:
        "webhook-timestamp is 3600 s in the future, more than the tolerance of 300 s: check the server's clock",
    });
  });

  it.each([
    ['webhook-id', { id: undefined }],
    ['webhook-timestamp', { timestamp: undefined }],
    ['webhook-signature', { signature: undefined }],
  ])('refuses a missing %s, naming it', (header, missing) => {
    const signed = headersOf(standardWebhookHeaders('msg_6', payload, secret, signedAt(now)));
    expect(
      refusal(() => verifyStandardWebhook(body(payload), { ...signed, ...missing }, [key], 300, now)),
    ).toEqual({
      failure: 'missing',
      header,
      message: `${header} header is missing`,
    });
  });

  it.each([
    [
      'a timestamp that is not whole seconds',
      { timestamp: `${now}abc` },
      'webhook-timestamp',
      'Unix time in whole seconds',
    ],
    [
      'a timestamp in milliseconds written as a date',
      { timestamp: new Date().toISOString() },
      'webhook-timestamp',
      'Unix time in whole seconds',
    ],
    [
      'only asymmetric v1a entries',
      { signature: 'v1a,c2lnbmVkIGJ5IGVkMjU1MTk=' },
      'webhook-signature',
      'space-separated v1,<base64> signatures',
    ],
    [
      'an entry without a version',
      { signature: 'c2lnbmVk' },
      'webhook-signature',
      'space-separated v1,<base64> signatures',
    ],
    [
      'a v1 entry that is not base64',
      { signature: 'v1,%%%' },
      'webhook-signature',
      'space-separated v1,<base64> signatures',
    ],
  ])('refuses %s as malformed', (_case, change, header, expected) => {
    const signed = headersOf(standardWebhookHeaders('msg_7', payload, secret, signedAt(now)));
    expect(
      refusal(() => verifyStandardWebhook(body(payload), { ...signed, ...change }, [key], 300, now)),
    ).toEqual({
      failure: 'malformed',
      header,
      message: `${header} header is malformed: expected ${expected}`,
    });
  });
});

describe('Stripe: Stripe-Signature, by the stripe SDK', () => {
  const secret = 'whsec_unit_current';
  const event = { id: 'evt_unit', object: 'event', type: 'payment_intent.succeeded' };
  const payload = JSON.stringify(event);
  const sign = (options: { secret?: string; timestamp?: number } = {}) =>
    Stripe.webhooks.generateTestHeaderString({
      payload,
      secret: options.secret ?? secret,
      timestamp: options.timestamp,
    });
  const verify = (header: unknown, secrets: string[] = [secret], raw = body(payload), tolerance = 300) =>
    verifyStripeSignature(Stripe.webhooks, raw, header, secrets, tolerance);

  it('returns the event the SDK parsed from the verified bytes', () => {
    expect(verify(sign())).toEqual(event);
  });

  it('passes a delivery signed with the second secret of a rotation', () => {
    expect(verify(sign({ secret: 'whsec_unit_next' }), [secret, 'whsec_unit_next'])).toEqual(event);
  });

  it("refuses another secret or other bytes as a mismatch, with the SDK's reason", () => {
    for (const [header, raw] of [
      [sign({ secret: 'whsec_other' }), body(payload)],
      [sign(), body(payload.replace('evt_unit', 'evt_else'))],
    ] as const) {
      const refused = refusal(() => verify(header, [secret], raw));
      expect(refused).toMatchObject({ failure: 'mismatch', header: 'Stripe-Signature' });
      expect(refused.message).toMatch(
        /^Stripe-Signature does not match the raw request body; .*\(stripe: No signatures found matching the expected signature for payload\./,
      );
    }
  });

  it('refuses a signature older than the tolerance as stale, only if a secret matched', () => {
    const old = Math.floor(Date.now() / 1000) - 600;
    const stale = refusal(() => verify(sign({ timestamp: old })));
    expect(stale).toMatchObject({ failure: 'stale', header: 'Stripe-Signature' });
    const [, age] = /^Stripe-Signature is (\d+) s old, more than the tolerance of 300 s/.exec(
      stale.message,
    ) ?? [stale.message];
    expect(Number(age)).toBeGreaterThanOrEqual(600);
    expect(Number(age)).toBeLessThan(660);
    expect(verify(sign({ timestamp: old }), [secret], body(payload), 900)).toEqual(event);
    // A forged old signature is a mismatch, not a replay.
    expect(refusal(() => verify(sign({ secret: 'whsec_other', timestamp: old }))).failure).toBe('mismatch');
  });

  it('refuses a signature dated beyond the tolerance in the future as stale, saying so; accepts one within it', () => {
    const now = Math.floor(Date.now() / 1000);
    const ahead = refusal(() => verify(sign({ timestamp: now + 3_600 })));
    expect(ahead).toMatchObject({ failure: 'stale', header: 'Stripe-Signature' });
    const [, seconds] =
      /^Stripe-Signature is (\d+) s in the future, more than the tolerance of 300 s: check the server's clock$/.exec(
        ahead.message,
      ) ?? [ahead.message];
    // 3,600 s when signed, a few less by the time it was checked on a busy machine.
    expect(Number(seconds)).toBeLessThanOrEqual(3_600);
    expect(Number(seconds)).toBeGreaterThan(3_540);
    // Clocks drift: a few minutes ahead is within the tolerance, as a few minutes old is.
    expect(verify(sign({ timestamp: now + 200 }))).toEqual(event);
    expect(verify(sign({ timestamp: now + 3_600 }), [secret], body(payload), 7_200)).toEqual(event);
    // A forged future signature is a mismatch: the clock message is for genuine signatures only.
    expect(refusal(() => verify(sign({ secret: 'whsec_other', timestamp: now + 3_600 }))).failure).toBe(
      'mismatch',
    );
  });

  /** What JSON.parse says about `text`: the reason the SDK's parse gives. */
  const parseError = (text: string) => {
    try {
      JSON.parse(text);
    } catch (error) {
      return (error as SyntaxError).message;
    }
    throw new Error(`${text} parses`);
  };
  /** Signs `raw` as Stripe signs a payload: the HMAC of its UTF-8 reading. */
  const signBytes = (raw: Buffer, timestamp?: number) =>
    Stripe.webhooks.generateTestHeaderString({ payload: raw.toString('utf8'), secret, timestamp });

  it.each([
    ['a form', body('id=evt_unit&type=payment_intent.succeeded')],
    ['UTF-16 (its ASCII is valid UTF-8, with NULs)', Buffer.from(payload, 'utf16le')],
    ['truncated JSON', body(payload.slice(0, -1))],
  ])(
    "refuses a correctly signed body that is %s as a body failure, with the parser's reason",
    (_case, raw) => {
      expect(refusal(() => verify(signBytes(raw), [secret], raw))).toEqual({
        failure: 'body',
        header: 'Stripe-Signature',
        message: `Stripe-Signature is valid, but the signed body is not JSON (${parseError(raw.toString('utf8'))}); a delivery carries its event as UTF-8 JSON`,
      });
    },
  );

  it('refuses a correctly signed empty body as a body failure', () => {
    const empty = Buffer.alloc(0);
    expect(refusal(() => verify(signBytes(empty), [secret], empty))).toEqual({
      failure: 'body',
      header: 'Stripe-Signature',
      message:
        'Stripe-Signature is valid, but the signed body is empty; a delivery carries its event as JSON',
    });
  });

  it('checks the time before the body, and a forged unparsable body is still a mismatch', () => {
    const form = body('id=evt_unit');
    const now = Math.floor(Date.now() / 1000);
    expect(refusal(() => verify(signBytes(form, now + 3_600), [secret], form)).failure).toBe('stale');
    expect(refusal(() => verify(signBytes(form, now - 600), [secret], form)).failure).toBe('stale');
    const forged = Stripe.webhooks.generateTestHeaderString({
      payload: 'id=evt_unit',
      secret: 'whsec_other',
    });
    expect(refusal(() => verify(forged, [secret], form)).failure).toBe('mismatch');
  });

  it.each([
    ['no timestamp', `v1=${'a'.repeat(64)}`],
    ['no v1 signature', `t=${Math.floor(Date.now() / 1000)},v0=${'a'.repeat(64)}`],
    ['a timestamp that is not a number', `t=soon,v1=${'a'.repeat(64)}`],
    ['an empty v1 signature', `t=${Math.floor(Date.now() / 1000)},v1=`],
    ['a stray entry', 'garbage'],
  ])('refuses %s as malformed, before asking the SDK', (_case, header) => {
    expect(refusal(() => verify(header))).toEqual({
      failure: 'malformed',
      header: 'Stripe-Signature',
      message: 'Stripe-Signature header is malformed: expected t=<timestamp>,v1=<hex signature>',
    });
  });

  it('accepts extra schemes beside v1 (Stripe adds v0 in test mode)', () => {
    expect(verify(`${sign()},v0=${'b'.repeat(64)}`)).toEqual(event);
  });

  it('refuses a missing header', () => {
    expect(refusal(() => verify(undefined)).message).toBe('Stripe-Signature header is missing');
  });
});

describe('constant-time comparison', () => {
  it('compares digests of unequal length as unequal instead of throwing', () => {
    expect(digestsEqual(Buffer.alloc(32, 1), Buffer.alloc(31, 1))).toBe(false);
    expect(digestsEqual(Buffer.alloc(32, 1), Buffer.alloc(32, 1))).toBe(true);
    expect(digestsEqual(Buffer.alloc(32, 1), Buffer.alloc(32, 2))).toBe(false);
  });

  it("decodes only real base64 (Node's decoder would skip stray characters)", () => {
    expect(decodeBase64('aGVsbG8=')).toEqual(Buffer.from('hello'));
    expect(decodeBase64('aGVsbG8')).toEqual(Buffer.from('hello'));
    expect(decodeBase64('aGV sbG8=')).toBeUndefined();
    expect(decodeBase64('a')).toBeUndefined();
    expect(decodeBase64('')).toBeUndefined();
  });
});

describe('stripe stays optional', () => {
  /** Every TypeScript file under `dir`. */
  const sources = (dir: string): string[] =>
    readdirSync(dir, { withFileTypes: true }).flatMap((entry) =>
      entry.isDirectory()
        ? sources(join(dir, entry.name))
        : entry.name.endsWith('.ts')
          ? [join(dir, entry.name)]
          : [],
    );

  it('no library file imports the stripe SDK statically, so apps without it still load the library', () => {
    const importers = sources('lib').filter((file) =>
      /(?:from\s+|import\s*\(\s*)['"]stripe['"]/.test(readFileSync(file, 'utf8')),
    );
    expect(importers).toEqual([]);
  });
});
