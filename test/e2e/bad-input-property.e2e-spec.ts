import { createHmac } from 'node:crypto';
import { deflateSync, gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import {
  headerEmpty,
  headerMalformed,
  headerMissing,
  signatureMismatch,
} from '../../lib/idempotency.messages.js';
import { signedBodyEmpty, signedBodyNotJson } from '../../lib/guards/signed-body.js';
import { MAX_CLAIM_KEY_BYTES } from '../../lib/core/idempotency-key.js';
import { HeaderKeyedController } from '../fixtures/bad-input-property.fixture.js';
import { GithubWebhookController, StripeWebhookController } from '../fixtures/signature-guards.fixture.js';
import { FixtureController, WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type AdapterName, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { RawHttpClient, type RawResponse } from '../support/raw-http-client.js';
import { stripeSignature } from '../support/webhook-signers.js';
import {
  keyEmpty,
  keyExtractorThrew,
  keyHasControl,
  keyHasNul,
  keyNotString,
  keyNotWellFormed,
  keyTooLong,
  keyTooManyBytes,
} from '../../lib/core/idempotency-key.js';
import { rawBodyNotKept } from '../../lib/guards/raw-body.js';

/**
 * Bad input, by property: thousands of generated deliveries (JSON of every shape, raw bytes under
 * assorted content types, keys of every type, delivery and signature headers missing, empty,
 * repeated, long or forged, Stripe signatures stale, forged or an hour ahead, bodies empty,
 * UTF-16, a form or nested 40,000 deep) on body-keyed, header-keyed and signature-guarded routes
 * (GitHub's HMAC, and Stripe's SDK, which parses the raw bytes itself) in both claim modes, on an
 * app with the default maxKeyLength and on one with it raised far above (where only the claims
 * index's byte bound stops a long key). Every answer is 2xx or 4xx, never 5xx; a 4xx wrote no row
 * at all; a 2xx wrote its claim and its effect exactly once, and a redelivery of it is a replay
 * that writes nothing. Where the outcome follows from the input alone (a JSON object under
 * application/json, a key header, a signature) the exact status, message and key are checked
 * too, so the property cannot pass by refusing everything.
 *
 * Reproduce a failure with the printed seed: PROPERTY_SEED=<seed> (and PROPERTY_RUNS=<n>).
 */

const SEED = Number(process.env.PROPERTY_SEED ?? 0x5eed_2024);
/**
 * Cases per adapter: 5,000 with PROPERTY_FULL=1 (both together make the 10,000 the issue asks
 * for), as `npm run test:property` runs them in CI (`.ci/run`, after `npm test`); `npm test` runs
 * the first 1,500 of the same seed's sequence, enough for every route to clear the not-vacuous
 * bound below (the signed route is accepted least: 35 of 1,500 on Express; 16 of 1,000 is too few).
 */
const RUNS = Number(process.env.PROPERTY_RUNS ?? (process.env.PROPERTY_FULL === '1' ? 5_000 : 1_500));
/**
 * Shrinking is bounded in count: a failure is reported within seconds (a few hundred deliveries),
 * however large its first counterexample.
 */
const MAX_SHRINKS = 200;
/**
 * A hang guard, not a budget: 5,000 cases take about 30 s per adapter on an idle 2-core machine
 * and 2 to 4 times that beside other suites; every delivery is bounded by the client's timeout.
 */
const TEST_TIMEOUT_MS = 600_000;

const SECRET = 'bad-input-property-github-secret';
const STRIPE_SECRET = 'whsec_bad_input_property';
const DELIVERY_HEADER = 'X-GitHub-Delivery';
const SIGNATURE_HEADER = 'X-Hub-Signature-256';
const STRIPE_HEADER = 'Stripe-Signature';
/** The module's default maxKeyLength. */
const MAX_KEY_LENGTH = 255;
/** Each case goes to one of two apps: the default one, or one whose maxKeyLength only the byte bound undercuts. */
type AppName = 'default' | 'roomy';
const MAX_KEY_LENGTHS: Record<AppName, number> = { default: MAX_KEY_LENGTH, roomy: 100_000 };
/** Body limits of the platforms' JSON parsers as Nest configures them (body-parser's 100kb, Fastify's 1 MiB). */
const BODY_LIMIT: Record<AdapterName, number> = { express: 100 * 1024, fastify: 1024 * 1024 };
/** Node's default limit on a request's header section: a larger one is answered 431 before any app code. */
const MAX_HEADER_BYTES = 16 * 1024;
/** Fields the fixture handlers act on (`block` parks, `fail` throws, `amount` is an integer column). */
const RESERVED_FIELDS = new Set(['id', 'amount', 'block', 'fail']);
/** Content types under which both platforms parse a JSON body as JSON. */
const JSON_TYPES = ['application/json', 'application/json; charset=utf-8'];

type Route = 'orders' | 'external' | 'header' | 'header-external' | 'signed' | 'stripe';
type Json = fc.JsonValue;

/** The key field of a JSON body, before the case's unique prefix is applied. */
type KeyShape =
  | { kind: 'suffix'; suffix: string }
  | { kind: 'length'; length: number }
  | { kind: 'wide'; text: string }
  | { kind: 'empty' }
  | { kind: 'value'; value: Json }
  | { kind: 'absent' };

type BodyShape =
  | { kind: 'object'; key: KeyShape; extras: Record<string, Json>; contentType: string | undefined }
  | { kind: 'nested'; key: KeyShape; wrap: 'data' | 'array' }
  | { kind: 'json'; value: Json }
  | { kind: 'deep'; depth: number; open: '[' | '{"a":' }
  | { kind: 'emptyJson' }
  | { kind: 'utf16'; key: KeyShape; charset: 'utf-16le' | 'utf-16' }
  | { kind: 'huge'; suffix: string; size: number; fill: string }
  | { kind: 'badUtf8'; suffix: string; bytes: Uint8Array }
  | { kind: 'form'; suffix: string; tail: string }
  | { kind: 'raw'; bytes: Uint8Array; contentType: string | undefined }
  | { kind: 'none' };

/** `X-GitHub-Delivery`, the key of the header-keyed and signed routes (sent on every route). */
type DeliveryShape =
  | { kind: 'absent' }
  | { kind: 'blank'; value: '' | ' ' | '\t ' }
  | { kind: 'value'; suffix: string; name: string }
  | { kind: 'repeated'; suffixes: string[] }
  | { kind: 'long'; length: number };

/** `X-Hub-Signature-256` (sent on every route; only the signed route reads it). */
type SignatureShape =
  | { kind: 'absent' }
  | { kind: 'blank'; value: '' | ' ' }
  | { kind: 'garbage'; value: string }
  | { kind: 'randomHex'; hex: string }
  | { kind: 'otherSecret'; secret: string }
  | { kind: 'tampered'; extra: string }
  | { kind: 'correct'; upper: boolean }
  | { kind: 'repeated' };

/** `Stripe-Signature` (sent on every route; only the Stripe route reads it), dated relative to now. */
type StripeSignatureShape =
  | { kind: 'absent' }
  | { kind: 'blank' }
  | { kind: 'malformed' }
  | { kind: 'otherSecret' }
  | { kind: 'correct'; aheadSeconds: 0 | 120 }
  | { kind: 'hourAhead' }
  | { kind: 'stale' };

/** `Content-Encoding`: a compressed body, one that only says so, or a coding nobody supports. */
type Encoding = 'gzip' | 'deflate' | 'notGzip' | 'unknown';

interface CaseShape {
  app: AppName;
  route: Route;
  body: BodyShape;
  delivery: DeliveryShape;
  signature: SignatureShape;
  stripe: StripeSignatureShape;
  encoding: Encoding | undefined;
  redeliver: boolean;
}

// ---- Generators ---------------------------------------------------------------------------

/** Any UTF-16 code unit, NUL and lone surrogates included, with the troublesome ones favoured. */
const codeUnit = fc.oneof(
  { arbitrary: fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)), weight: 3 },
  {
    arbitrary: fc.constantFrom(
      '\u0000',
      '\ud800',
      '\udbff',
      '\udc00',
      '\udfff',
      '\ud83d\ude00',
      '\ufffd',
      '\ufeff',
      '\u2028',
      '"',
      '\\',
      '%',
      '&',
      '=',
      ' ',
      '\t',
      '\n',
      'é',
    ),
    weight: 2,
  },
  { arbitrary: fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }), weight: 1 },
  { arbitrary: fc.constantFrom(...'abcxyz-_019'), weight: 3 },
);
const keySuffix = fc.string({ unit: codeUnit, maxLength: 24 });
/** A well-formed code point of any UTF-8 width. */
const wideUnit = fc
  .oneof(
    fc.integer({ min: 0x21, max: 0x7e }),
    fc.integer({ min: 0x80, max: 0x7ff }),
    fc.integer({ min: 0x800, max: 0xd7ff }),
    fc.integer({ min: 0x10000, max: 0x10ffff }),
  )
  .map((point) => String.fromCodePoint(point));
/**
 * Characters Node lets a client put in a header value: tab, visible ASCII, and Latin-1 obs-text.
 * Tab and C1 (U+0080-U+009F) are control characters, which no key may hold: one character in 32,
 * so that most values have none and the signed route (accepted least) still accepts its share.
 */
const headerUnit = fc
  .oneof(
    { arbitrary: fc.integer({ min: 0x20, max: 0x7e }), weight: 48 },
    { arbitrary: fc.constant(0x09), weight: 1 },
    { arbitrary: fc.integer({ min: 0x80, max: 0x9f }), weight: 1 },
    { arbitrary: fc.integer({ min: 0xa0, max: 0xff }), weight: 14 },
  )
  .map((c) => String.fromCharCode(c));
const headerSuffix = fc.string({ unit: headerUnit, maxLength: 24 });
const jsonValue = fc.jsonValue({ maxDepth: 3, stringUnit: codeUnit });

const keyShape: fc.Arbitrary<KeyShape> = fc.oneof(
  { arbitrary: fc.record({ kind: fc.constant('suffix' as const), suffix: keySuffix }), weight: 6 },
  {
    arbitrary: fc.record({
      kind: fc.constant('length' as const),
      length: fc.oneof(
        fc.integer({ min: MAX_KEY_LENGTH - 3, max: MAX_KEY_LENGTH + 3 }),
        fc.integer({ min: 1, max: 1_000 }),
        fc.integer({ min: MAX_CLAIM_KEY_BYTES - 40, max: MAX_CLAIM_KEY_BYTES }),
        fc.constantFrom(10_000, 60_000),
      ),
    }),
    weight: 2,
  },
  {
    // Long and in many scripts: 1 to 4 bytes a code point, and nothing for PostgreSQL to compress.
    arbitrary: fc.record({
      kind: fc.constant('wide' as const),
      text: fc.string({ unit: wideUnit, minLength: 200, maxLength: 1_500, size: 'max' }),
    }),
    weight: 1,
  },
  { arbitrary: fc.constant({ kind: 'empty' as const }), weight: 1 },
  {
    arbitrary: fc.record({
      kind: fc.constant('value' as const),
      value: fc.oneof(
        fc.integer(),
        fc.double(),
        fc.constant(null),
        fc.boolean(),
        fc.array(jsonValue, { maxLength: 3 }),
        fc.dictionary(fc.string({ maxLength: 6 }), jsonValue, { maxKeys: 3 }),
      ),
    }),
    weight: 2,
  },
  { arbitrary: fc.constant({ kind: 'absent' as const }), weight: 1 },
);

const contentType = fc.oneof(
  { arbitrary: fc.constantFrom(...JSON_TYPES), weight: 4 },
  {
    arbitrary: fc.constantFrom(
      undefined,
      '',
      'Application/JSON',
      'application/json; charset=utf-16',
      'application/json; charset=latin1',
      'application/vnd.github+json',
      'text/plain',
      'text/plain; charset=utf-8',
      'application/x-www-form-urlencoded',
      'application/octet-stream',
      'multipart/form-data; boundary=x',
      'application/xml',
      'a/b/c;;;=',
      '*/*',
    ),
    weight: 2,
  },
);

const bodyShape: fc.Arbitrary<BodyShape> = fc.oneof(
  {
    arbitrary: fc.record({
      kind: fc.constant('object' as const),
      key: keyShape,
      extras: fc.dictionary(
        fc.string({ unit: codeUnit, maxLength: 8 }).filter((name) => !RESERVED_FIELDS.has(name)),
        jsonValue,
        { maxKeys: 4 },
      ),
      contentType,
    }),
    weight: 12,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('nested' as const),
      key: keyShape,
      wrap: fc.constantFrom('data' as const, 'array' as const),
    }),
    weight: 1,
  },
  { arbitrary: fc.record({ kind: fc.constant('json' as const), value: jsonValue }), weight: 2 },
  {
    arbitrary: fc.record({
      kind: fc.constant('deep' as const),
      depth: fc.oneof(fc.integer({ min: 1, max: 100 }), fc.constantFrom(5_000, 20_000, 40_000)),
      open: fc.constantFrom('[' as const, '{"a":' as const),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('huge' as const),
      suffix: keySuffix,
      size: fc.constantFrom(20_000, 90_000, 150_000, 900_000, 1_200_000),
      fill: fc.constantFrom('x', 'é', '\u{1F600}', '\ud800', '\u0000'),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('badUtf8' as const),
      suffix: keySuffix,
      bytes: fc.uint8Array({ minLength: 1, maxLength: 8 }).map((bytes) => bytes.map((b) => b | 0x80)),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('form' as const),
      suffix: keySuffix,
      tail: fc.string({ unit: codeUnit, maxLength: 16 }),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('raw' as const),
      bytes: fc.oneof(
        fc.uint8Array({ maxLength: 64 }),
        fc.string({ unit: codeUnit, maxLength: 64 }).map((text) => new Uint8Array(Buffer.from(text, 'utf8'))),
      ),
      contentType,
    }),
    weight: 3,
  },
  { arbitrary: fc.constant({ kind: 'none' as const }), weight: 1 },
  { arbitrary: fc.constant({ kind: 'emptyJson' as const }), weight: 1 },
  {
    arbitrary: fc.record({
      kind: fc.constant('utf16' as const),
      key: keyShape,
      charset: fc.constantFrom('utf-16le' as const, 'utf-16' as const),
    }),
    weight: 1,
  },
);

/** The delivery header's name in assorted letter cases: header names are case-insensitive. */
const deliveryName = fc.constantFrom(
  DELIVERY_HEADER,
  DELIVERY_HEADER.toLowerCase(),
  DELIVERY_HEADER.toUpperCase(),
);

const deliveryShape: fc.Arbitrary<DeliveryShape> = fc.oneof(
  { arbitrary: fc.constant({ kind: 'absent' as const }), weight: 2 },
  {
    arbitrary: fc.record({
      kind: fc.constant('blank' as const),
      value: fc.constantFrom('' as const, ' ' as const, '\t ' as const),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({ kind: fc.constant('value' as const), suffix: headerSuffix, name: deliveryName }),
    weight: 6,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('repeated' as const),
      suffixes: fc.array(headerSuffix, { minLength: 2, maxLength: 3 }),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('long' as const),
      length: fc.oneof(
        fc.integer({ min: MAX_KEY_LENGTH - 3, max: MAX_KEY_LENGTH + 3 }),
        fc.integer({ min: MAX_CLAIM_KEY_BYTES - 40, max: MAX_CLAIM_KEY_BYTES }),
        fc.constantFrom(1_000, 20_000),
      ),
    }),
    weight: 1,
  },
);

const signatureShape: fc.Arbitrary<SignatureShape> = fc.oneof(
  { arbitrary: fc.constant({ kind: 'absent' as const }), weight: 1 },
  {
    arbitrary: fc.record({
      kind: fc.constant('blank' as const),
      value: fc.constantFrom('' as const, ' ' as const),
    }),
    weight: 1,
  },
  { arbitrary: fc.record({ kind: fc.constant('garbage' as const), value: headerSuffix }), weight: 1 },
  {
    arbitrary: fc.record({
      kind: fc.constant('randomHex' as const),
      hex: fc.string({ unit: fc.constantFrom(...'0123456789abcdef'), minLength: 64, maxLength: 64 }),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('otherSecret' as const),
      secret: fc.string({ minLength: 1, maxLength: 12 }),
    }),
    weight: 1,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('tampered' as const),
      extra: fc.string({ minLength: 1, maxLength: 4 }),
    }),
    weight: 1,
  },
  { arbitrary: fc.record({ kind: fc.constant('correct' as const), upper: fc.boolean() }), weight: 6 },
  { arbitrary: fc.constant({ kind: 'repeated' as const }), weight: 1 },
);

const stripeSignatureShape: fc.Arbitrary<StripeSignatureShape> = fc.oneof(
  {
    arbitrary: fc.constantFrom<StripeSignatureShape>(
      { kind: 'absent' },
      { kind: 'blank' },
      { kind: 'malformed' },
      { kind: 'otherSecret' },
      { kind: 'hourAhead' },
      { kind: 'stale' },
    ),
    weight: 3,
  },
  {
    arbitrary: fc.record({
      kind: fc.constant('correct' as const),
      aheadSeconds: fc.constantFrom(0 as const, 120 as const),
    }),
    weight: 12,
  },
);

const caseShape: fc.Arbitrary<CaseShape> = fc.record({
  app: fc.oneof(
    { arbitrary: fc.constant<AppName>('default'), weight: 3 },
    { arbitrary: fc.constant<AppName>('roomy'), weight: 1 },
  ),
  // The Stripe route twice as often: its SDK parses the body and dates the signature, so it has
  // the most ways to refuse a delivery.
  route: fc.oneof(
    {
      arbitrary: fc.constantFrom<Route>('orders', 'external', 'header', 'header-external', 'signed'),
      weight: 5,
    },
    { arbitrary: fc.constant<Route>('stripe'), weight: 2 },
  ),
  body: bodyShape,
  delivery: deliveryShape,
  signature: signatureShape,
  stripe: stripeSignatureShape,
  encoding: fc.oneof(
    { arbitrary: fc.constant(undefined), weight: 12 },
    { arbitrary: fc.constantFrom<Encoding>('gzip', 'deflate', 'notGzip', 'unknown'), weight: 1 },
  ),
  redeliver: fc.boolean().chain((on) => (on ? fc.boolean() : fc.constant(false))),
});

// ---- Building a delivery and predicting its outcome ----------------------------------------

const PATHS: Record<Route, string> = {
  orders: '/orders',
  external: '/external',
  header: '/property/header',
  'header-external': '/property/header-external',
  signed: '/webhooks/github',
  stripe: '/webhooks/stripe',
};
const SCOPES: Record<Route, string> = {
  orders: 'FixtureController.order',
  external: 'FixtureController.external',
  header: 'HeaderKeyedController.header',
  'header-external': 'HeaderKeyedController.headerExternal',
  signed: 'GithubWebhookController.handle',
  stripe: 'StripeWebhookController.handle',
};
/** Where a processed delivery's effect lands. */
const EFFECT_TABLE: Record<Route, 'orders' | 'downstream_calls'> = {
  orders: 'orders',
  external: 'downstream_calls',
  header: 'orders',
  'header-external': 'downstream_calls',
  signed: 'orders',
  stripe: 'orders',
};

/** What the input alone decides: accepted under `key`, rejected (with `message` when known), or either. */
type Prediction =
  | { outcome: 'accept'; key: string }
  | { outcome: 'reject'; status?: number; message?: string | RegExp }
  | { outcome: 'either'; key?: string };

/** One delivery, built from a shape for the case's unique prefix. */
interface Built {
  headers: Record<string, string | string[]>;
  body: Buffer | undefined;
  prediction: Prediction;
  /**
   * The key the case is about (the body's key field, or the key header), when it is a string
   * PostgreSQL can be asked about (no NUL, no lone surrogate): no row may exist under it unless
   * the delivery was processed.
   */
  named: string | undefined;
}

const isWellFormed = (text: string) => (text as unknown as { isWellFormed(): boolean }).isWellFormed();

/** What a key is checked against: the route's scope and the app's maxKeyLength. */
interface KeyRules {
  scope: string;
  maxLength: number;
}

/** The library's verdict on a key, independently stated: the message of the first rule it breaks. */
function keyVerdict(
  { scope, maxLength }: KeyRules,
  key: unknown,
): { valid: true; key: string } | { valid: false; message: string } {
  if (typeof key !== 'string') return { valid: false, message: keyNotString(scope, key) };
  if (key.length === 0) return { valid: false, message: keyEmpty(scope) };
  if (key.length > maxLength) return { valid: false, message: keyTooLong(scope, key.length, maxLength) };
  if (key.includes('\u0000')) return { valid: false, message: keyHasNul(scope) };
  // A control character (C0, DEL, C1): the first one is named.
  const control = /[\u0001-\u001f\u007f-\u009f]/.exec(key); // eslint-disable-line no-control-regex
  if (control) return { valid: false, message: keyHasControl(scope, control[0], control.index) };
  if (!isWellFormed(key)) return { valid: false, message: keyNotWellFormed(scope) };
  const [scopeBytes, keyBytes] = [Buffer.byteLength(scope), Buffer.byteLength(key)];
  if (scopeBytes + keyBytes > MAX_CLAIM_KEY_BYTES) {
    return { valid: false, message: keyTooManyBytes(scope, keyBytes, scopeBytes, MAX_CLAIM_KEY_BYTES) };
  }
  return { valid: true, key };
}

/** The key field's value for the case's prefix, as the server parses it back. */
function keyValue(shape: KeyShape, prefix: string): unknown {
  switch (shape.kind) {
    case 'suffix':
      return prefix + shape.suffix;
    case 'length':
      return prefix + 'k'.repeat(Math.max(0, shape.length - prefix.length));
    case 'wide':
      return prefix + shape.text;
    case 'empty':
      return '';
    case 'value':
      // What the server parses back: JSON has no NaN, Infinity or -0.
      return JSON.parse(JSON.stringify(shape.value)) as unknown;
    case 'absent':
      return undefined;
  }
}

/** How Node's HTTP parser hands a header value to the app: surrounding spaces and tabs dropped. */
const trimOws = (value: string) => value.replace(/^[\t ]+|[\t ]+$/g, '');

interface DeliveryHeader {
  headers: Record<string, string | string[]>;
  /** The header's value as the app reads it, when it has one. */
  seen?: string;
  /** The key the route sees, or why the extractor throws. */
  verdict: { valid: true; key: string } | { valid: false; message?: string };
  /** Answered 431 by Node before any app code. */
  tooLarge: boolean;
}

function buildDelivery(shape: DeliveryShape, prefix: string, rules: KeyRules): DeliveryHeader {
  const threw = (message: string) => ({
    valid: false as const,
    message: keyExtractorThrew(rules.scope, new Error(message)),
  });
  const checked = (key: string) => {
    const verdict = keyVerdict(rules, key);
    return verdict.valid ? verdict : { valid: false as const, message: verdict.message };
  };
  switch (shape.kind) {
    case 'absent':
      return { headers: {}, verdict: threw(headerMissing(DELIVERY_HEADER)), tooLarge: false };
    case 'blank':
      return {
        headers: { [DELIVERY_HEADER]: shape.value },
        verdict: threw(headerEmpty(DELIVERY_HEADER)),
        tooLarge: false,
      };
    case 'value': {
      const value = prefix + shape.suffix;
      const seen = trimOws(value);
      return { headers: { [shape.name]: value }, seen, verdict: checked(seen), tooLarge: false };
    }
    case 'repeated': {
      const values = shape.suffixes.map((suffix, index) => `${prefix}${index}${suffix}`);
      // Node joins a repeated header it has no rule for with ", ".
      const seen = values.map(trimOws).join(', ');
      return { headers: { [DELIVERY_HEADER]: values }, seen, verdict: checked(seen), tooLarge: false };
    }
    case 'long': {
      const value = prefix + 'g'.repeat(Math.max(0, shape.length - prefix.length));
      const tooLarge = value.length > MAX_HEADER_BYTES;
      return {
        headers: { [DELIVERY_HEADER]: value },
        seen: value,
        verdict: tooLarge ? { valid: false } : checked(value),
        tooLarge,
      };
    }
  }
}

const hmac = (secret: string, bytes: Buffer) => createHmac('sha256', secret).update(bytes).digest('hex');

/** The signature header, and whether the signed route's guard passes it (given a raw body). */
function buildSignature(
  shape: SignatureShape,
  body: Buffer,
): { headers: Record<string, string | string[]>; passes: boolean; status?: number; message?: string } {
  const header = (value: string | string[]) => ({ [SIGNATURE_HEADER]: value });
  const mismatch = { status: 401, message: signatureMismatch(SIGNATURE_HEADER, 'the raw request body') };
  const malformed = {
    status: 400,
    message: headerMalformed(SIGNATURE_HEADER, 'sha256= followed by 64 hexadecimal digits'),
  };
  switch (shape.kind) {
    case 'absent':
      return { headers: {}, passes: false, status: 400, message: headerMissing(SIGNATURE_HEADER) };
    case 'blank':
      return {
        headers: header(shape.value),
        passes: false,
        status: 400,
        message: headerEmpty(SIGNATURE_HEADER),
      };
    case 'garbage': {
      const value = trimOws(shape.value);
      if (value === '')
        return {
          headers: header(shape.value),
          passes: false,
          status: 400,
          message: headerEmpty(SIGNATURE_HEADER),
        };
      return { headers: header(shape.value), passes: false, ...malformed };
    }
    case 'randomHex':
      return { headers: header(`sha256=${shape.hex}`), passes: false, ...mismatch };
    case 'otherSecret':
      return { headers: header(`sha256=${hmac(SECRET + shape.secret, body)}`), passes: false, ...mismatch };
    case 'tampered':
      return {
        headers: header(`sha256=${hmac(SECRET, Buffer.concat([body, Buffer.from(shape.extra)]))}`),
        passes: false,
        ...mismatch,
      };
    case 'correct': {
      const hex = hmac(SECRET, body);
      return { headers: header(`sha256=${shape.upper ? hex.toUpperCase() : hex}`), passes: true };
    }
    case 'repeated': {
      const value = `sha256=${hmac(SECRET, body)}`;
      return { headers: header([value, value]), passes: false, ...malformed };
    }
  }
}

const nowSeconds = () => Math.floor(Date.now() / 1000);

/**
 * The Stripe-Signature header, and whether the Stripe route's guard passes it (given a raw body).
 * Signed over the UTF-8 reading of the bytes, as the stripe SDK reads them, so that a body that is
 * not UTF-8 still reaches the SDK's parse, as a sender's would.
 */
function buildStripeSignature(
  shape: StripeSignatureShape,
  body: Buffer,
): { headers: Record<string, string>; passes: boolean; status?: number; message?: string | RegExp } {
  const signed = body.toString('utf8');
  const sign = (secret: string, timestamp: number) => ({
    [STRIPE_HEADER]: stripeSignature(signed, secret, timestamp),
  });
  switch (shape.kind) {
    case 'absent':
      return { headers: {}, passes: false, status: 400, message: headerMissing(STRIPE_HEADER) };
    case 'blank':
      return {
        headers: { [STRIPE_HEADER]: '' },
        passes: false,
        status: 400,
        message: headerEmpty(STRIPE_HEADER),
      };
    case 'malformed':
      return {
        headers: { [STRIPE_HEADER]: 'v1=deadbeef' },
        passes: false,
        status: 400,
        message: headerMalformed(STRIPE_HEADER, 't=<timestamp>,v1=<hex signature>'),
      };
    case 'otherSecret':
      return {
        headers: sign('whsec_not_this_endpoint', nowSeconds()),
        passes: false,
        status: 401,
        message: /^Stripe-Signature does not match the raw request body; /,
      };
    case 'correct':
      return { headers: sign(STRIPE_SECRET, nowSeconds() + shape.aheadSeconds), passes: true };
    case 'hourAhead':
      return {
        headers: sign(STRIPE_SECRET, nowSeconds() + 3_600),
        passes: false,
        status: 401,
        message:
          /^Stripe-Signature is \d+ s in the future, more than the tolerance of 300 s: check the server's clock$/,
      };
    case 'stale':
      return {
        headers: sign(STRIPE_SECRET, nowSeconds() - 600),
        passes: false,
        status: 401,
        message: /^Stripe-Signature is \d+ s old, more than the tolerance of 300 s/,
      };
  }
}

/** What JSON.parse says about `text`: the reason the Stripe guard gives for a body the SDK cannot parse. */
function parseError(text: string): string {
  try {
    JSON.parse(text);
  } catch (error) {
    return (error as Error).message;
  }
  throw new Error(`${text} parses as JSON`);
}

/** Fastify's own answers to a JSON body it cannot parse, before any guard runs. */
const FASTIFY_EMPTY_JSON = "Body cannot be empty when content-type is set to 'application/json'";
const FASTIFY_BAD_JSON = "Body is not valid JSON but content-type is set to 'application/json'";

/** The body's bytes and content type, the key field it carries, and whether both platforms surely parse it. */
interface BuiltBody {
  bytes: Buffer | undefined;
  contentType: string | undefined;
  /** The body's key field as the JSON-keyed routes see it, when the body surely parses as JSON. */
  key: { known: true; value: unknown } | { known: false; invalid: boolean };
  /** 'yes': parsed as JSON on both platforms; 'no': refused by the platform; 'unknown': depends. */
  parses: 'yes' | 'no' | 'unknown';
  /**
   * How a correctly signed delivery of this body is refused where the guard reads more than the
   * platform did: the Stripe route's SDK parsing the raw bytes (`stripe`), and a guard refusing
   * an empty body (`signed`, the GitHub route).
   */
  refusedWhenSigned?: Partial<Record<'stripe' | 'signed', { status: number; message?: string | RegExp }>>;
}

function buildBody(shape: BodyShape, prefix: string, adapter: AdapterName, rules: KeyRules): BuiltBody {
  const json = (value: unknown, type: string | undefined = 'application/json') => {
    const text = JSON.stringify(value);
    return { bytes: text === undefined ? undefined : Buffer.from(text, 'utf8'), contentType: type };
  };
  /** Fastify refuses `__proto__` and `constructor` keys; Express keeps them as plain keys. */
  const poisoned = (bytes: Buffer | undefined) =>
    !!bytes && /"(__proto__|constructor)"/.test(bytes.toString('utf8'));
  switch (shape.kind) {
    case 'object': {
      const id = keyValue(shape.key, prefix);
      const { bytes, contentType: type } = json(
        shape.key.kind === 'absent' ? shape.extras : { ...shape.extras, id },
        shape.contentType,
      );
      const invalid = !keyVerdict(rules, id).valid;
      if (!JSON_TYPES.includes(type ?? '') || poisoned(bytes)) {
        // Unparsed, parsed as text or a form, or refused: the key field is never a better key than this one.
        return { bytes, contentType: type, key: { known: false, invalid }, parses: 'unknown' };
      }
      if (bytes!.length > BODY_LIMIT[adapter])
        return { bytes, contentType: type, key: { known: false, invalid }, parses: 'no' };
      return { bytes, contentType: type, key: { known: true, value: id }, parses: 'yes' };
    }
    case 'nested': {
      const inner = { id: keyValue(shape.key, prefix) };
      const { bytes, contentType: type } = json(shape.wrap === 'data' ? { data: inner } : [inner]);
      if (poisoned(bytes))
        return { bytes, contentType: type, key: { known: false, invalid: true }, parses: 'unknown' };
      return { bytes, contentType: type, key: { known: true, value: undefined }, parses: 'yes' };
    }
    case 'json': {
      const { bytes, contentType: type } = json(shape.value);
      const { value } = shape;
      const object = typeof value === 'object' && value !== null;
      // Express's parser is strict (objects and arrays only); Fastify's takes any JSON value.
      const parses = object && !poisoned(bytes) ? 'yes' : 'unknown';
      const hasId = object && !Array.isArray(value) && Object.hasOwn(value, 'id');
      if (hasId)
        return { bytes, contentType: type, key: { known: false, invalid: false }, parses: 'unknown' };
      return {
        bytes,
        contentType: type,
        key: parses === 'yes' ? { known: true, value: undefined } : { known: false, invalid: true },
        parses,
      };
    }
    case 'deep': {
      const close = shape.open === '[' ? ']' : '}';
      const text = shape.open.repeat(shape.depth) + '1' + close.repeat(shape.depth);
      return {
        bytes: Buffer.from(text),
        contentType: 'application/json',
        key: { known: false, invalid: true },
        parses: 'unknown',
      };
    }
    case 'huge': {
      const id = prefix + shape.suffix;
      // `size` is in bytes on the wire: an escaped NUL or surrogate takes 6, an emoji 4.
      const fillBytes = Buffer.byteLength(JSON.stringify(shape.fill), 'utf8') - 2;
      const fill = shape.fill.repeat(Math.ceil(shape.size / fillBytes));
      const { bytes, contentType: type } = json({ id, fill });
      const limit = BODY_LIMIT[adapter];
      // Near the limit, framing and counting differ by a few bytes: no prediction there.
      const parses = bytes!.length < limit * 0.95 ? 'yes' : bytes!.length > limit * 1.05 ? 'no' : 'unknown';
      return {
        bytes,
        contentType: type,
        key:
          parses === 'yes'
            ? { known: true, value: id }
            : { known: false, invalid: !keyVerdict(rules, id).valid },
        parses,
      };
    }
    case 'badUtf8': {
      // Bytes that are not UTF-8 inside the key: the platforms decode them to U+FFFD.
      const [head, tail] = JSON.stringify({ id: prefix + shape.suffix + '\u0001' }).split('\\u0001');
      const bytes = Buffer.concat([
        Buffer.from(head, 'utf8'),
        Buffer.from(shape.bytes),
        Buffer.from(tail, 'utf8'),
      ]);
      return {
        bytes,
        contentType: 'application/json',
        key: { known: false, invalid: !keyVerdict(rules, prefix + shape.suffix).valid },
        parses: 'unknown',
      };
    }
    case 'form': {
      const text = `id=${encodeURIComponent(isWellFormed(shape.suffix) ? prefix + shape.suffix : prefix)}${shape.tail}`;
      const bytes = Buffer.from(text, 'utf8');
      return {
        bytes,
        contentType: 'application/x-www-form-urlencoded',
        key: { known: false, invalid: false },
        parses: 'unknown',
        // Both platforms keep a form's raw bytes, which the stripe SDK cannot parse as JSON.
        refusedWhenSigned: {
          stripe: {
            status: 400,
            message: signedBodyNotJson(STRIPE_HEADER, parseError(bytes.toString('utf8'))),
          },
        },
      };
    }
    case 'raw':
      return {
        bytes: Buffer.from(shape.bytes),
        contentType: shape.contentType,
        key: { known: false, invalid: false },
        parses: 'unknown',
      };
    case 'none':
      return {
        bytes: undefined,
        contentType: undefined,
        key: { known: false, invalid: true },
        parses: 'unknown',
      };
    case 'emptyJson': {
      // Express parses it to {} (no key), keeping an empty raw body; Fastify refuses it.
      const refusal = (header: string) => ({
        status: 400,
        message: adapter === 'express' ? signedBodyEmpty(header) : FASTIFY_EMPTY_JSON,
      });
      return {
        bytes: Buffer.alloc(0),
        contentType: 'application/json',
        key: { known: false, invalid: true },
        parses: 'unknown',
        refusedWhenSigned: { stripe: refusal(STRIPE_HEADER), signed: refusal(SIGNATURE_HEADER) },
      };
    }
    case 'utf16': {
      // Express decodes it by its charset and parses the JSON; Fastify refuses any charset but
      // UTF-8. The stripe SDK reads the raw bytes as UTF-8: never JSON (every ASCII character
      // carries a NUL byte).
      const id = keyValue(shape.key, prefix);
      const text = JSON.stringify(shape.key.kind === 'absent' ? {} : { id });
      const bytes = Buffer.concat([
        shape.charset === 'utf-16' ? Buffer.from([0xff, 0xfe]) : Buffer.alloc(0),
        Buffer.from(text, 'utf16le'),
      ]);
      const stripe = {
        status: 400,
        message:
          adapter === 'express'
            ? signedBodyNotJson(STRIPE_HEADER, parseError(bytes.toString('utf8')))
            : FASTIFY_BAD_JSON,
      };
      const contentType = `application/json; charset=${shape.charset}`;
      if (adapter === 'fastify')
        return {
          bytes,
          contentType,
          key: { known: false, invalid: true },
          parses: 'unknown',
          refusedWhenSigned: { stripe },
        };
      // The limit is on the raw bytes, two a character here; near it, framing decides.
      const limit = BODY_LIMIT[adapter];
      if (bytes.length > limit * 1.05)
        return { bytes, contentType, key: { known: false, invalid: true }, parses: 'no' };
      if (bytes.length > limit * 0.95)
        return {
          bytes,
          contentType,
          key: { known: false, invalid: !keyVerdict(rules, id).valid },
          parses: 'unknown',
        };
      return {
        bytes,
        contentType,
        key: { known: true, value: id },
        parses: 'yes',
        refusedWhenSigned: { stripe },
      };
    }
  }
}

const CODINGS: Record<Encoding, string> = {
  gzip: 'gzip',
  deflate: 'deflate',
  notGzip: 'gzip',
  unknown: 'x-unknown',
};

function encode(bytes: Buffer | undefined, encoding: Encoding | undefined): Buffer | undefined {
  if (bytes === undefined) return undefined;
  if (encoding === 'gzip') return gzipSync(bytes);
  if (encoding === 'deflate') return deflateSync(bytes);
  return bytes;
}

/**
 * A Content-Encoding makes the platforms differ (Express inflates gzip and deflate, Fastify does
 * not), so only what holds either way is kept: a delivery refused on its own terms (a bad key,
 * signature or size) is still refused, though maybe with another status; a good one may be.
 */
function encoded(prediction: Prediction): Prediction {
  if (prediction.outcome === 'accept') return { outcome: 'either', key: prediction.key };
  if (prediction.outcome === 'reject' && prediction.status !== 431) return { outcome: 'reject' };
  return prediction;
}

/** See Built.named. */
function namedKey(shape: CaseShape, prefix: string, delivery: DeliveryHeader): string | undefined {
  let key: unknown = delivery.seen;
  if (shape.route === 'orders' || shape.route === 'external' || shape.route === 'stripe') {
    const { body } = shape;
    if (body.kind === 'object' || body.kind === 'nested' || body.kind === 'utf16')
      key = keyValue(body.key, prefix);
    else if (body.kind === 'huge' || body.kind === 'form') key = prefix + body.suffix;
    else key = undefined;
  }
  return typeof key === 'string' && key !== '' && !key.includes('\u0000') && isWellFormed(key)
    ? key
    : undefined;
}

/** The wire form of a case and what must come of it. */
function build(shape: CaseShape, prefix: string, adapter: AdapterName): Built {
  const rules = { scope: SCOPES[shape.route], maxLength: MAX_KEY_LENGTHS[shape.app] };
  const body = buildBody(shape.body, prefix, adapter, rules);
  const delivery = buildDelivery(shape.delivery, prefix, rules);
  const signature = buildSignature(shape.signature, body.bytes ?? Buffer.alloc(0));
  const stripe = buildStripeSignature(shape.stripe, body.bytes ?? Buffer.alloc(0));
  const headers: Record<string, string | string[]> = {
    ...delivery.headers,
    ...signature.headers,
    ...stripe.headers,
    ...(body.contentType === undefined ? {} : { 'Content-Type': body.contentType }),
    ...(shape.encoding === undefined ? {} : { 'Content-Encoding': CODINGS[shape.encoding] }),
  };
  const bytes = encode(body.bytes, shape.encoding);
  const built = (prediction: Prediction): Built => ({
    headers,
    body: bytes,
    prediction: shape.encoding === undefined ? prediction : encoded(prediction),
    named: namedKey(shape, prefix, delivery),
  });
  if (delivery.tooLarge) return built({ outcome: 'reject', status: 431 });
  if (body.parses === 'no') return built({ outcome: 'reject', status: 413 });

  if (shape.route === 'stripe') {
    // The guard runs first; the event the stripe SDK parses from the raw bytes is what is keyed.
    if (!stripe.passes) {
      return built(
        body.parses === 'yes'
          ? { outcome: 'reject', status: stripe.status, message: stripe.message }
          : { outcome: 'reject' },
      );
    }
    if (body.bytes === undefined) {
      return built({ outcome: 'reject', status: 400, message: rawBodyNotKept(STRIPE_HEADER, undefined) });
    }
    const refused = body.refusedWhenSigned?.stripe;
    if (refused) return built({ outcome: 'reject', ...refused });
  }

  if (shape.route === 'orders' || shape.route === 'external' || shape.route === 'stripe') {
    if (!body.key.known) return built(body.key.invalid ? { outcome: 'reject' } : { outcome: 'either' });
    const verdict = keyVerdict(rules, body.key.value);
    return built(
      verdict.valid
        ? { outcome: 'accept', key: verdict.key }
        : { outcome: 'reject', status: 400, message: verdict.message },
    );
  }

  if (shape.route === 'signed') {
    // The guard runs first: a refused signature is answered before the key is read.
    if (!signature.passes) {
      return built(
        body.parses === 'yes'
          ? { outcome: 'reject', status: signature.status, message: signature.message }
          : { outcome: 'reject' },
      );
    }
    if (body.bytes === undefined) {
      return built({ outcome: 'reject', status: 400, message: rawBodyNotKept(SIGNATURE_HEADER, undefined) });
    }
    const refused = body.refusedWhenSigned?.signed;
    if (refused) return built({ outcome: 'reject', ...refused });
  }
  const { verdict } = delivery;
  if (!verdict.valid)
    return built(
      body.parses === 'yes'
        ? { outcome: 'reject', status: 400, message: verdict.message }
        : { outcome: 'reject' },
    );
  // A body-less delivery is fine where the header is the key (but unverifiable on the signed route, above).
  const bodyFine = body.parses === 'yes' || (shape.body.kind === 'none' && shape.route !== 'signed');
  return built(bodyFine ? { outcome: 'accept', key: verdict.key } : { outcome: 'either', key: verdict.key });
}

// ---- The property -----------------------------------------------------------------------------

interface Footprint {
  claims: number;
  orders: number;
  downstream: number;
  keyClaims: number;
  keyOrders: number;
  keyDownstream: number;
}

describe.each(ADAPTERS)('bad input, by property (%s)', (adapter) => {
  let db: TestDatabase;
  const apps: Partial<Record<AppName, RunningApp>> = {};
  const clients: Partial<Record<AppName, RawHttpClient>> = {};

  beforeAll(async () => {
    db = await createTestDatabase();
    for (const name of ['default', 'roomy'] as const) {
      apps[name] = await startApp(
        adapter,
        [
          WebhookFixtureModule.forDatabase({
            databaseUrl: db.url,
            controllers: [
              FixtureController,
              HeaderKeyedController,
              GithubWebhookController,
              StripeWebhookController,
            ],
            idempotency: {
              reporter: false,
              maxKeyLength: MAX_KEY_LENGTHS[name],
              signatures: { github: { secret: SECRET }, stripe: { secret: STRIPE_SECRET } },
            },
          }),
        ],
        { rawBody: true },
      );
      clients[name] = new RawHttpClient(apps[name].url);
    }
  });

  afterAll(async () => {
    for (const client of Object.values(clients)) client.close();
    for (const running of Object.values(apps)) await running.close();
    await db?.drop();
  });

  /**
   * Everything a delivery can write, in one statement: the row counts (which catch a row under
   * any key), and the rows under the case's named key, if it has one (by index: a scan per case
   * would cost more than the delivery).
   */
  const footprint = async (scope: string, key: string | undefined): Promise<Footprint> => {
    const { rows } = await db.pool.query<Footprint>(
      `SELECT (SELECT count(*) FROM processed_events)::int AS claims,
              (SELECT count(*) FROM orders)::int AS orders,
              (SELECT count(*) FROM downstream_calls)::int AS downstream,
              (SELECT count(*) FROM processed_events WHERE scope = $1 AND event_key = $2)::int AS "keyClaims",
              (SELECT count(*) FROM orders WHERE event_id = $2)::int AS "keyOrders",
              (SELECT count(*) FROM downstream_calls WHERE event_id = $2)::int AS "keyDownstream"`,
      [scope, key ?? null],
    );
    return rows[0];
  };

  it(
    `answers ${RUNS} generated deliveries 2xx or 4xx, writing nothing for a 4xx and one effect for a 2xx`,
    async () => {
      const started = Date.now();
      const tally = new Map<string, number>();
      const count = (label: string) => tally.set(label, (tally.get(label) ?? 0) + 1);
      let serial = 0;
      let carried: Footprint | undefined;

      const describeAnswer = (answer: RawResponse) => `${answer.status} ${answer.text.slice(0, 400)}`;
      const messageOf = (answer: RawResponse) => (answer.json as { message?: unknown } | undefined)?.message;

      const property = fc.asyncProperty(fc.limitShrink(caseShape, MAX_SHRINKS), async (shape) => {
        // A fresh prefix per execution (shrinking re-runs included) keeps every key unique.
        const prefix = `${adapter[0]}${++serial}-`;
        const { headers, body, prediction, named } = build(shape, prefix, adapter);
        const scope = SCOPES[shape.route];
        const table = EFFECT_TABLE[shape.route];
        // The previous case's final counts are this one's start: cases run one at a time, and
        // nothing else writes to this database. No row can be under a key of a prefix not yet used.
        const before = carried
          ? { ...carried, keyClaims: 0, keyOrders: 0, keyDownstream: 0 }
          : await footprint(scope, named);
        carried = undefined; // until this case's checks pass (a failed one leaves it unknown)
        const client = clients[shape.app]!;
        const answer = await client.post({ path: PATHS[shape.route], headers, body });
        const after = await footprint(scope, named);
        const context = `${shape.route} on the ${shape.app} app, prefix ${prefix}: answered ${describeAnswer(answer)}`;

        const accepted = answer.status >= 200 && answer.status < 300;
        const rejected = answer.status >= 400 && answer.status < 500;
        if (!accepted && !rejected) throw new Error(`neither 2xx nor 4xx: ${context}`);
        count(`${shape.route} ${accepted ? '2xx' : '4xx'}`);
        count(`status ${answer.status}`);
        count(`predicted ${prediction.outcome}`);

        if (prediction.outcome === 'accept' && !accepted)
          throw new Error(`expected 2xx for key ${JSON.stringify(prediction.key)}: ${context}`);
        if (prediction.outcome === 'reject') {
          if (!rejected) throw new Error(`expected 4xx: ${context}`);
          if (prediction.status !== undefined)
            expect({ context, status: answer.status }).toEqual({ context, status: prediction.status });
          if (prediction.message !== undefined)
            expect({ context, message: messageOf(answer) }).toEqual({
              context,
              message:
                typeof prediction.message === 'string'
                  ? prediction.message
                  : expect.stringMatching(prediction.message),
            });
        }

        if (rejected) {
          // Nothing at all was written: no claim, no order, no downstream call.
          expect({ context, after }).toEqual({ context, after: before });
          if (answer.status !== 431) {
            // A refusal Nest answered names what is wrong.
            expect({ context, message: typeof messageOf(answer) }).toEqual({ context, message: 'string' });
          }
        } else {
          const key = await expectOneEffect(prefix, before, after, table, shape.route, context);
          if (prediction.outcome !== 'reject' && prediction.key !== undefined)
            expect({ context, key }).toEqual({ context, key: prediction.key });
          expect({
            context,
            processed: (answer.json as { processed?: unknown } | undefined)?.processed,
          }).toEqual({ context, processed: key });
          if (named !== undefined && named !== key) {
            // Processed under another key than the one the case names: nothing under that one.
            const { keyClaims, keyOrders, keyDownstream } = after;
            expect({ context, named: [keyClaims, keyOrders, keyDownstream] }).toEqual({
              context,
              named: [0, 0, 0],
            });
          }
        }

        if (shape.redeliver) {
          // The sender's retry of the same delivery: the same verdict, and nothing more written.
          const again = await client.post({ path: PATHS[shape.route], headers, body });
          const replayed = { status: again.status, replayed: again.headers['idempotent-replayed'] };
          if (accepted)
            expect({ context, replayed }).toEqual({
              context,
              replayed: { status: answer.status, replayed: 'true' },
            });
          else expect({ context, status: again.status }).toEqual({ context, status: answer.status });
          expect({ context, footprint: await footprint(scope, named) }).toEqual({
            context,
            footprint: after,
          });
          count('redelivered');
        }
        carried = after;
      });

      /** A 2xx wrote one claim, done, and one effect row, both under this case's key; returns the key. */
      const expectOneEffect = async (
        prefix: string,
        before: Footprint,
        after: Footprint,
        table: 'orders' | 'downstream_calls',
        route: Route,
        context: string,
      ): Promise<string> => {
        const grew = {
          claims: after.claims - before.claims,
          orders: after.orders - before.orders,
          downstream: after.downstream - before.downstream,
        };
        expect({ context, grew }).toEqual({
          context,
          grew: { claims: 1, orders: table === 'orders' ? 1 : 0, downstream: table === 'orders' ? 0 : 1 },
        });
        // The newest effect row, its claims and its duplicates, in one statement.
        const { rows } = await db.pool.query<{ key: string; claims: unknown; effects: number }>(
          `SELECT newest.event_id AS key,
                  (SELECT coalesce(json_agg(json_build_object('scope', scope, 'status', status)), '[]')
                     FROM processed_events WHERE event_key = newest.event_id) AS claims,
                  (SELECT count(*)::int FROM ${table} WHERE event_id = newest.event_id) AS effects
             FROM (SELECT event_id FROM ${table} ORDER BY id DESC LIMIT 1) AS newest`,
        );
        const { key, claims, effects } = rows[0];
        // Keys are unique per case: a key outside the prefix would be one nobody can check for duplicates.
        expect({ context, underPrefix: key.startsWith(prefix) }).toEqual({ context, underPrefix: true });
        expect({ context, claims, effects }).toEqual({
          context,
          claims: [{ scope: SCOPES[route], status: 'done' }],
          effects: 1,
        });
        return key;
      };

      console.log(
        `bad-input property (${adapter}): seed ${SEED}, ${RUNS} runs (PROPERTY_SEED / PROPERTY_RUNS to change)`,
      );
      await fc.assert(property, { seed: SEED, numRuns: RUNS });
      const seconds = ((Date.now() - started) / 1000).toFixed(1);
      console.log(
        `bad-input property (${adapter}): ${serial} executions in ${seconds} s`,
        Object.fromEntries([...tally].sort()),
      );

      // Not vacuous: every route both processed and refused deliveries.
      for (const route of Object.keys(PATHS)) {
        expect({ route, accepted: (tally.get(`${route} 2xx`) ?? 0) > RUNS / 50 }).toEqual({
          route,
          accepted: true,
        });
        expect({ route, rejected: (tally.get(`${route} 4xx`) ?? 0) > RUNS / 50 }).toEqual({
          route,
          rejected: true,
        });
      }
    },
    TEST_TIMEOUT_MS,
  );
});
