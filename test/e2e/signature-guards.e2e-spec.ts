import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication, NestApplicationOptions, Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import request, { type Response } from 'supertest';
import type { WebhookSignatureOptions } from '../../lib/index.js';
import { headerMalformed, headerMissing } from '../../lib/idempotency.messages.js';
import { signedBodyEmpty, signedBodyNotJson, signedBodyWrongType } from '../../lib/guards/signed-body.js';
import {
  GithubWebhookController,
  SignatureGuardsFixtureModule,
  SignedEventPatternController,
  StandardWebhooksController,
} from '../fixtures/signature-guards.fixture.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { bootFailure as initFailure } from '../support/boot-failure.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import {
  githubSignature,
  shopifySignature,
  standardWebhookHeaders,
  standardWebhookSecret,
  stripeSignature,
} from '../support/webhook-signers.js';
import { keyExtractorThrew } from '../../lib/core/idempotency-key.js';
import { rawBodyDisabled, rawBodyNotKept } from '../../lib/guards/raw-body.js';
import {
  rawBodyNotEnabled,
  signatureGuardOnMessageHandler,
  signatureGuardsRefused,
  signatureSecretMissing,
} from '../../lib/guards/signature-guards.explorer.js';

/** GitHub's documented test vector ("Validating webhook deliveries"). */
const GITHUB_VECTOR = {
  secret: "It's a Secret to Everybody",
  payload: 'Hello, World!',
  signature: 'sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17',
};

/** Each sender's secrets as configured: the current one and the next one of a rotation. */
const SECRETS = {
  stripe: ['whsec_signature_guards_e2e_current', 'whsec_signature_guards_e2e_next'],
  github: [GITHUB_VECTOR.secret, 'the next GitHub webhook secret'],
  standard: [
    standardWebhookSecret('signature-guards-current'),
    standardWebhookSecret('signature-guards-next'),
  ],
  shopify: ['shopify-client-secret-current', 'shopify-client-secret-next'],
} as const;

const SIGNATURES: WebhookSignatureOptions = {
  stripe: { secret: [...SECRETS.stripe] },
  github: { secret: [...SECRETS.github] },
  standardWebhooks: { secret: [...SECRETS.standard] },
  shopify: { secret: [...SECRETS.shopify] },
};

/** Secrets of the same formats the app does not know: what a forger would sign with. */
const FORGED = {
  stripe: 'whsec_not_this_endpoints_secret',
  github: 'not the webhook secret',
  standard: standardWebhookSecret('not-this-endpoint'),
  shopify: 'not-the-client-secret',
};

/** How one delivery is signed: with which secret, how long ago, or not at all. */
interface Signing {
  secret?: string;
  /** Seconds between the signed timestamp and now; negative is the future. @default 0 */
  age?: number;
  unsigned?: boolean;
  /** Leave out the sender's delivery-id header (the idempotency key) but sign correctly. */
  noDeliveryId?: boolean;
  /** Replace the signature header's value. */
  signature?: string;
}

/** A sender as the tests drive it. */
interface Sender {
  name: keyof typeof SECRETS;
  path: string;
  /** The signature header, as the sender documents it (and as the answers name it). */
  header: string;
  timestamped: boolean;
  /** The key the app claims for delivery `id` (Stripe's is the event id in the body). */
  keyOf(id: string): string;
  /** The JSON body the sender sends for delivery `id`. */
  payloadOf(id: string): string;
  /** The sender's headers for delivery `id` carrying `payload`, signed as `signing` says. */
  headersOf(id: string, payload: string, signing?: Signing): Record<string, string>;
}

const nowSeconds = () => Math.floor(Date.now() / 1000);

function post(url: string, path: string, payload: string, headers: Record<string, string>) {
  return request(url)
    .post(path)
    .set({ 'Content-Type': 'application/json', ...headers })
    .send(payload);
}

/** Delivery `id` as `sender` sends it, signed as `signing` says. */
function deliver(sender: Sender, url: string, id: string, signing: Signing = {}): Promise<Response> {
  const payload = sender.payloadOf(id);
  return post(url, sender.path, payload, sender.headersOf(id, payload, signing));
}

const SENDERS: Sender[] = [
  {
    name: 'stripe',
    path: '/webhooks/stripe',
    header: 'Stripe-Signature',
    timestamped: true,
    keyOf: (id) => `evt_${id}`,
    payloadOf: (id) => JSON.stringify({ id: `evt_${id}`, object: 'event', type: 'payment_intent.succeeded' }),
    headersOf(_id, payload, signing = {}): Record<string, string> {
      const secret = signing.secret ?? SECRETS.stripe[0];
      const signature =
        signing.signature ?? stripeSignature(payload, secret, nowSeconds() - (signing.age ?? 0));
      return signing.unsigned ? {} : { 'Stripe-Signature': signature };
    },
  },
  {
    name: 'github',
    path: '/webhooks/github',
    header: 'X-Hub-Signature-256',
    timestamped: false,
    keyOf: (id) => id,
    payloadOf: (id) => JSON.stringify({ action: 'completed', delivery: id }),
    headersOf(id, payload, signing = {}) {
      const signature = signing.signature ?? githubSignature(payload, signing.secret ?? SECRETS.github[0]);
      return {
        ...(signing.noDeliveryId ? {} : { 'X-GitHub-Delivery': id }),
        'X-GitHub-Event': 'check_run',
        ...(signing.unsigned ? {} : { 'X-Hub-Signature-256': signature }),
      };
    },
  },
  {
    name: 'standard',
    path: '/webhooks/standard',
    header: 'webhook-signature',
    timestamped: true,
    keyOf: (id) => id,
    payloadOf: (id) => JSON.stringify({ type: 'invoice.paid', data: { id } }),
    headersOf(id, payload, signing = {}) {
      const signedAt = new Date((nowSeconds() - (signing.age ?? 0)) * 1000);
      const headers = standardWebhookHeaders(id, payload, signing.secret ?? SECRETS.standard[0], signedAt);
      if (signing.signature) headers['webhook-signature'] = signing.signature;
      const { 'webhook-signature': signature, ...unsigned } = headers;
      return signing.unsigned ? unsigned : { ...unsigned, 'webhook-signature': signature };
    },
  },
  {
    name: 'shopify',
    path: '/webhooks/shopify',
    header: 'X-Shopify-Hmac-Sha256',
    timestamped: false,
    keyOf: (id) => id,
    payloadOf: (id) => JSON.stringify({ id: 820982911946154500, email: 'jon@example.com', note: id }),
    headersOf(id, payload, signing = {}) {
      const signature = signing.signature ?? shopifySignature(payload, signing.secret ?? SECRETS.shopify[0]);
      return {
        ...(signing.noDeliveryId ? {} : { 'X-Shopify-Webhook-Id': id }),
        'X-Shopify-Topic': 'orders/create',
        ...(signing.unsigned ? {} : { 'X-Shopify-Hmac-Sha256': signature }),
      };
    },
  },
];

/** A header value of the sender's shape that no secret made. */
const MALFORMED: Record<Sender['name'], string> = {
  stripe: 'v1=deadbeef',
  github: 'sha1=757107ea0eb2509fc211221cce984b8a37570b6d',
  standard: 'v1,not base64!',
  shopify: 'not base64!',
};

/** The `expected ...` part of each sender's malformed-header answer. */
const MALFORMED_EXPECTED: Record<Sender['name'], string> = {
  stripe: 't=<timestamp>,v1=<hex signature>',
  github: 'sha256= followed by 64 hexadecimal digits',
  standard: 'space-separated v1,<base64> signatures',
  shopify: 'the base64 of a 32-byte HMAC-SHA256',
};

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
});

afterAll(async () => {
  await db?.drop();
});

/** Everything a delivery can write: its claim and the handler's order. */
async function footprint(key: string) {
  return {
    claims: await db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [key]),
    orders: await db.count('SELECT count(*) FROM orders WHERE event_id = $1', [key]),
  };
}

const allRows = async () => ({
  claims: await db.count('SELECT count(*) FROM processed_events'),
  orders: await db.count('SELECT count(*) FROM orders'),
});

describe.each(ADAPTERS)('signature guards on %s', (adapter) => {
  let running: RunningApp;

  beforeAll(async () => {
    running = await startApp(adapter, [SignatureGuardsFixtureModule.forDatabase(db.url, SIGNATURES)], {
      rawBody: true,
    });
  });

  afterAll(async () => {
    await running?.close();
  });

  const id = (sender: Sender, what: string) => `${adapter}-${sender.name}-${what}`;

  describe.each(SENDERS.map((sender) => [sender.name, sender] as const))('%s', (_name, sender) => {
    it("a delivery signed by the sender's SDK or algorithm is processed once, its duplicate replayed", async () => {
      const delivery = id(sender, 'valid');
      const key = sender.keyOf(delivery);
      const first = await deliver(sender, running.url, delivery);
      expect({ status: first.status, body: first.body }).toEqual({ status: 200, body: { processed: key } });
      expect(first.headers['idempotent-replayed']).toBeUndefined();

      const duplicate = await deliver(sender, running.url, delivery);
      expect(duplicate.status).toBe(200);
      expect(duplicate.headers['idempotent-replayed']).toBe('true');
      expect(await footprint(key)).toEqual({ claims: 1, orders: 1 });
    });

    it('a delivery signed with the second secret of a rotation passes too', async () => {
      const delivery = id(sender, 'rotated');
      const answer = await deliver(sender, running.url, delivery, { secret: SECRETS[sender.name][1] });
      expect(answer.status).toBe(200);
      expect(await footprint(sender.keyOf(delivery))).toEqual({ claims: 1, orders: 1 });
    });

    it('a forged signature is refused 401 naming the header, before any claim; the real one then runs', async () => {
      const delivery = id(sender, 'forged');
      const key = sender.keyOf(delivery);
      const before = await allRows();
      const forged = await deliver(sender, running.url, delivery, { secret: FORGED[sender.name] });
      expect(forged.status).toBe(401);
      expect(forged.body.message).toMatch(new RegExp(`^${sender.header} does not match `));
      expect(await allRows()).toEqual(before);

      // Nothing was claimed, so the genuine delivery of the same event is processed, not replayed.
      const genuine = await deliver(sender, running.url, delivery);
      expect(genuine.status).toBe(200);
      expect(genuine.headers['idempotent-replayed']).toBeUndefined();
      expect(await footprint(key)).toEqual({ claims: 1, orders: 1 });
    });

    it('a missing signature is refused 400 naming the header, and writes nothing', async () => {
      const delivery = id(sender, 'unsigned');
      const before = await allRows();
      const answer = await deliver(sender, running.url, delivery, { unsigned: true });
      expect(answer.status).toBe(400);
      expect(answer.body.message).toBe(headerMissing(sender.header));
      expect(await allRows()).toEqual(before);
      expect(await footprint(sender.keyOf(delivery))).toEqual({ claims: 0, orders: 0 });
    });

    it('a malformed signature header is refused 400 naming the header, and writes nothing', async () => {
      const delivery = id(sender, 'malformed');
      const before = await allRows();
      const answer = await deliver(sender, running.url, delivery, { signature: MALFORMED[sender.name] });
      expect(answer.status).toBe(400);
      expect(answer.body.message).toBe(headerMalformed(sender.header, MALFORMED_EXPECTED[sender.name]));
      expect(await allRows()).toEqual(before);
    });

    if (sender.timestamped) {
      it('a stale signature (10 minutes old, tolerance 300 s) is refused 401 naming the header', async () => {
        const delivery = id(sender, 'stale');
        const before = await allRows();
        const answer = await deliver(sender, running.url, delivery, { age: 600 });
        expect(answer.status).toBe(401);
        const timestampHeader = sender.name === 'standard' ? 'webhook-timestamp' : sender.header;
        const [, age] = new RegExp(
          `^${timestampHeader} is (\\d+) s old, more than the tolerance of 300 s`,
        ).exec(answer.body.message) ?? [answer.body.message];
        // 600 s when signed, and a few more on a busy machine by the time it was checked.
        expect(Number(age)).toBeGreaterThanOrEqual(600);
        expect(Number(age)).toBeLessThan(660);
        expect(await allRows()).toEqual(before);
        expect(await footprint(sender.keyOf(delivery))).toEqual({ claims: 0, orders: 0 });
      });
    }
  });

  it('Standard Webhooks: a timestamp 10 minutes in the future is refused 401 too', async () => {
    const standard = SENDERS.find((sender) => sender.name === 'standard')!;
    const before = await allRows();
    const answer = await deliver(standard, running.url, `${adapter}-standard-future`, { age: -600 });
    expect(answer.status).toBe(401);
    const [, ahead] = /^webhook-timestamp is (\d+) s in the future, more than the tolerance of 300 s/.exec(
      answer.body.message,
    ) ?? [answer.body.message];
    // 600 s when signed, a few less by the time it was checked.
    expect(Number(ahead)).toBeLessThanOrEqual(600);
    expect(Number(ahead)).toBeGreaterThan(540);
    expect(await allRows()).toEqual(before);
  });

  it.each(SENDERS.filter((sender) => sender.timestamped).map((sender) => [sender.name, sender] as const))(
    '%s: a signature dated an hour in the future is refused 401, saying so, and writes nothing',
    async (_name, sender) => {
      const delivery = id(sender, 'hour-ahead');
      const before = await allRows();
      const answer = await deliver(sender, running.url, delivery, { age: -3_600 });
      expect(answer.status).toBe(401);
      const timestampHeader = sender.name === 'standard' ? 'webhook-timestamp' : sender.header;
      const [, ahead] = new RegExp(
        `^${timestampHeader} is (\\d+) s in the future, more than the tolerance of 300 s: check the server's clock$`,
      ).exec(answer.body.message) ?? [answer.body.message];
      // 3,600 s when signed, a few less by the time it was checked.
      expect(Number(ahead)).toBeLessThanOrEqual(3_600);
      expect(Number(ahead)).toBeGreaterThan(3_540);
      expect(await allRows()).toEqual(before);
      expect(await footprint(sender.keyOf(delivery))).toEqual({ claims: 0, orders: 0 });
      // Within the tolerance, a clock a little ahead is no reason to refuse.
      const near = id(sender, 'minutes-ahead');
      expect((await deliver(sender, running.url, near, { age: -120 })).status).toBe(200);
      expect(await footprint(sender.keyOf(near))).toEqual({ claims: 1, orders: 1 });
    },
  );

  /** `payload` to `sender`'s route as `contentType`, correctly signed: the answer, and the rows it wrote. */
  const deliverSigned = async (sender: Sender, what: string, payload: string, contentType: string) => {
    const before = await allRows();
    const answer = await post(running.url, sender.path, payload, {
      ...sender.headersOf(id(sender, what), payload),
      'Content-Type': contentType,
    });
    const after = await allRows();
    return {
      answer,
      written: { claims: after.claims - before.claims, orders: after.orders - before.orders },
    };
  };

  it.each(SENDERS.map((sender) => [sender.name, sender] as const))(
    '%s: a correctly signed empty JSON body is refused 400 naming the problem, and writes nothing',
    async (_name, sender) => {
      const { answer, written } = await deliverSigned(sender, 'empty', '', 'application/json');
      expect(answer.status).toBe(400);
      // Fastify refuses an empty JSON body itself; Express parses it to {}, which the guard refuses.
      expect(answer.body.message).toBe(
        adapter === 'fastify'
          ? "Body cannot be empty when content-type is set to 'application/json'"
          : signedBodyEmpty(sender.header),
      );
      expect(written).toEqual({ claims: 0, orders: 0 });
    },
  );

  /** What JSON.parse says about `text`, as the stripe SDK's parse says it. */
  const parseError = (text: string) => {
    try {
      JSON.parse(text);
    } catch (error) {
      return (error as SyntaxError).message;
    }
    throw new Error(`${text} parses`);
  };

  it.each(
    SENDERS.filter((sender) => sender.name !== 'github').map((sender) => [sender.name, sender] as const),
  )(
    '%s: a correctly signed form body is refused 400 naming the problem, and writes nothing',
    async (_name, sender) => {
      const form = 'id=evt_form&type=payment_intent.succeeded';
      const type = 'application/x-www-form-urlencoded';
      const { answer, written } = await deliverSigned(sender, 'form', form, type);
      expect(answer.status).toBe(400);
      expect(answer.body.message).toBe(
        sender.name === 'stripe'
          ? signedBodyNotJson(sender.header, parseError(form))
          : signedBodyWrongType(sender.header, type, 'application/json'),
      );
      expect(written).toEqual({ claims: 0, orders: 0 });
    },
  );

  it('Stripe: a correctly signed UTF-16 body is refused 400 naming the problem, and writes nothing', async () => {
    const stripe = SENDERS.find((sender) => sender.name === 'stripe')!;
    // UTF-16LE of ASCII without a byte order mark: valid UTF-8 (with NULs), so the SDK verifies
    // the signature over it, and then cannot parse it.
    const utf16 = Buffer.from(stripe.payloadOf(id(stripe, 'utf16')), 'utf16le').toString('utf8');
    const { answer, written } = await deliverSigned(
      stripe,
      'utf16',
      utf16,
      'application/json; charset=utf-16le',
    );
    expect(answer.status).toBe(400);
    // Fastify's parser refuses it before the guard; Express decodes it by its charset.
    expect(answer.body.message).toBe(
      adapter === 'fastify'
        ? "Body is not valid JSON but content-type is set to 'application/json'"
        : signedBodyNotJson('Stripe-Signature', parseError(utf16)),
    );
    expect(written).toEqual({ claims: 0, orders: 0 });
  });

  it("GitHub: the documented test vector passes (payload 'Hello, World!', as a form body)", async () => {
    const delivery = `${adapter}-github-vector`;
    const answer = await request(running.url)
      .post('/webhooks/github')
      .set({
        'Content-Type': 'application/x-www-form-urlencoded',
        'X-GitHub-Delivery': delivery,
        'X-Hub-Signature-256': GITHUB_VECTOR.signature,
      })
      .send(GITHUB_VECTOR.payload);
    expect({ status: answer.status, body: answer.body }).toEqual({
      status: 200,
      body: { processed: delivery },
    });
    expect(await footprint(delivery)).toEqual({ claims: 1, orders: 1 });
  });

  it.each([
    ['github', 'X-GitHub-Delivery', 'GithubWebhookController.handle'],
    ['shopify', 'X-Shopify-Webhook-Id', 'ShopifyWebhookController.handle'],
  ] as const)(
    '%s: correctly signed but without its delivery header, 400 names the header (%s)',
    async (name, header, scope) => {
      const sender = SENDERS.find((candidate) => candidate.name === name)!;
      const before = await allRows();
      const answer = await deliver(sender, running.url, `${adapter}-${name}-no-id`, { noDeliveryId: true });
      expect(answer.status).toBe(400);
      expect(answer.body.message).toBe(keyExtractorThrew(scope, new Error(headerMissing(header))));
      expect(answer.body.message).toBe(
        `Idempotency key extractor of ${scope} threw: ${header} header is missing`,
      );
      expect(await allRows()).toEqual(before);
    },
  );

  it('a body Nest keeps no raw bytes of (text/plain) is refused 400, not as a bad signature', async () => {
    const delivery = `${adapter}-github-text`;
    const payload = 'zen: Keep it logically awesome.';
    const before = await allRows();
    const answer = await request(running.url)
      .post('/webhooks/github')
      .set({
        'Content-Type': 'text/plain',
        'X-GitHub-Delivery': delivery,
        'X-Hub-Signature-256': githubSignature(payload, SECRETS.github[0]),
      })
      .send(payload);
    expect(answer.status).toBe(400);
    expect(answer.body.message).toBe(rawBodyNotKept('X-Hub-Signature-256', 'text/plain'));
    expect(await allRows()).toEqual(before);
  });
});

describe.each(ADAPTERS)('signature guards at boot on %s', (adapter) => {
  /** A real app of `controllers`, created with `options`, not yet initialised. */
  async function createApp(
    signatures: WebhookSignatureOptions | undefined,
    options: NestApplicationOptions,
    controllers?: Type[],
  ): Promise<INestApplication> {
    const moduleRef = await Test.createTestingModule({
      imports: [SignatureGuardsFixtureModule.forDatabase(db.url, signatures, controllers)],
    }).compile();
    const appOptions = { logger: false as const, ...options };
    return adapter === 'fastify'
      ? moduleRef.createNestApplication(new FastifyAdapter(), appOptions)
      : moduleRef.createNestApplication(appOptions);
  }

  /** The error app.init() rejects with; the app is closed either way. */
  async function bootFailure(
    signatures: WebhookSignatureOptions | undefined,
    options: NestApplicationOptions,
    controllers?: Type[],
  ): Promise<Error> {
    return initFailure(await createApp(signatures, options, controllers));
  }

  it('an app created without rawBody: true does not start, naming every guarded route', async () => {
    const failure = await bootFailure(SIGNATURES, {});
    expect(failure.message).toBe(
      signatureGuardsRefused([
        rawBodyNotEnabled('StripeWebhookController.handle', 'StripeSignatureGuard'),
        rawBodyNotEnabled('GithubWebhookController.handle', 'GithubSignatureGuard'),
        rawBodyNotEnabled('StandardWebhooksController.handle', 'StandardWebhooksSignatureGuard'),
        rawBodyNotEnabled('ShopifyWebhookController.handle', 'ShopifySignatureGuard'),
      ]),
    );
    expect(failure.message).toMatch(
      /without rawBody: true: create it with NestFactory\.create\(AppModule, \{ rawBody: true \}\)/,
    );
  });

  it('NestFactory.create without rawBody: true fails the boot the same way', async () => {
    const module = SignatureGuardsFixtureModule.forDatabase(db.url, SIGNATURES, [GithubWebhookController]);
    // abortOnError: false, so a failure is thrown here instead of ending the Jest worker.
    const options = { logger: false as const, abortOnError: false };
    const app =
      adapter === 'fastify'
        ? await NestFactory.create(module, new FastifyAdapter(), options)
        : await NestFactory.create(module, options);
    expect((await initFailure(app)).message).toBe(
      signatureGuardsRefused([rawBodyNotEnabled('GithubWebhookController.handle', 'GithubSignatureGuard')]),
    );
  });

  it('a guarded route whose sender has no secret does not start, naming Class.method and the option', async () => {
    const failure = await bootFailure({ stripe: { secret: SECRETS.stripe[0] } }, { rawBody: true });
    expect(failure.message).toBe(
      signatureGuardsRefused([
        signatureSecretMissing('GithubWebhookController.handle', 'GithubSignatureGuard', 'github'),
        signatureSecretMissing(
          'StandardWebhooksController.handle',
          'StandardWebhooksSignatureGuard',
          'standardWebhooks',
        ),
        signatureSecretMissing('ShopifyWebhookController.handle', 'ShopifySignatureGuard', 'shopify'),
      ]),
    );
    expect(failure.message).toContain(
      'GithubWebhookController.handle is guarded by GithubSignatureGuard, but IdempotencyModule option signatures.github.secret is not set',
    );
  });

  it('with no signatures option at all, a guarded route does not start', async () => {
    const failure = await bootFailure(undefined, { rawBody: true }, [StandardWebhooksController]);
    expect(failure.message).toBe(
      signatureGuardsRefused([
        signatureSecretMissing(
          'StandardWebhooksController.handle',
          'StandardWebhooksSignatureGuard',
          'standardWebhooks',
        ),
      ]),
    );
  });

  it('a signature guard on a message handler does not start', async () => {
    const failure = await bootFailure(SIGNATURES, { rawBody: true }, [SignedEventPatternController]);
    expect(failure.message).toBe(
      signatureGuardsRefused([
        signatureGuardOnMessageHandler('SignedEventPatternController.handle', 'GithubSignatureGuard'),
      ]),
    );
  });

  it('bodyParser: false skips the boot check; a delivery without request.rawBody is answered 500, never 401', async () => {
    const app = await startApp(
      adapter,
      [SignatureGuardsFixtureModule.forDatabase(db.url, SIGNATURES, [GithubWebhookController])],
      { bodyParser: false },
    );
    try {
      const github = SENDERS.find((sender) => sender.name === 'github')!;
      const before = await allRows();
      const answer = await deliver(github, app.url, `${adapter}-github-no-parser`);
      expect(answer.status).toBe(500);
      expect(answer.body.message).toBe(rawBodyDisabled('X-Hub-Signature-256'));
      expect(answer.body.message).toContain('rawBody: true');
      expect(await allRows()).toEqual(before);
    } finally {
      await app.close();
    }
  });
});
