import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { ClientProxyFactory, Transport, type ClientProxy } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { lastValueFrom } from 'rxjs';
import request from 'supertest';
import { Idempotent, IdempotentWebhook } from '../../lib/index.js';
import { badClaimOption, missingKeyFunction, unprotectedHandlers } from '../../lib/idempotency.messages.js';
import {
  BootCheckModule,
  LoopbackWsAdapter,
  MethodOnEventPattern,
  MethodOnGateway,
  MethodOnRoute,
  SupportedController,
  SupportedGateway,
  SupportedWorker,
  WebhookOnGateway,
  WebhookOnProvider,
  WebhookOnResolver,
  ws,
  type BootCheckParts,
  type BootEvent,
} from '../fixtures/boot-check.fixture.js';
import { bootFailure as initFailure } from '../support/boot-failure.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { freePort } from '../support/postgres-server.js';
import { waitUntil } from '../support/wait-until.js';
import {
  gatewayUnsupported,
  methodOnFactoryProvider,
  methodOnHandler,
  resolverUnsupported,
  webhookOffHandler,
} from '../../lib/transports/idempotency.explorer.js';

/**
 * The boot check (transports/idempotency.explorer.ts): an app whose decorators would run a
 * handler unprotected, or answer duplicates wrongly, does not start, and says which Class.method.
 */
describe('boot check', () => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
  });

  afterAll(async () => {
    await db?.drop();
  });

  /** A real app of `parts` on the test database, not yet initialised. */
  async function createApp(parts: BootCheckParts): Promise<INestApplication> {
    const moduleRef = await Test.createTestingModule({
      imports: [BootCheckModule.forDatabase(db.url, parts)],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    app.useWebSocketAdapter(new LoopbackWsAdapter(app));
    return app;
  }

  /** The error app.init() rejects with; the app is closed either way. */
  async function bootFailure(parts: BootCheckParts): Promise<Error> {
    return initFailure(await createApp(parts));
  }

  it.each([
    [
      '@IdempotentWebhook on a @SubscribeMessage handler of a @WebSocketGateway',
      { providers: [WebhookOnGateway] },
      gatewayUnsupported('@IdempotentWebhook', 'WebhookOnGateway.pay'),
    ],
    [
      '@Idempotent in a @WebSocketGateway',
      { providers: [MethodOnGateway] },
      gatewayUnsupported('@Idempotent', 'MethodOnGateway.refund'),
    ],
    [
      '@IdempotentWebhook on a GraphQL @Resolver @Mutation',
      { providers: [WebhookOnResolver] },
      resolverUnsupported('@IdempotentWebhook', 'WebhookOnResolver.pay'),
    ],
    [
      '@IdempotentWebhook on a plain provider method',
      { providers: [WebhookOnProvider] },
      webhookOffHandler('WebhookOnProvider.charge'),
    ],
    [
      '@Idempotent on a @Post route',
      { controllers: [MethodOnRoute] },
      methodOnHandler('MethodOnRoute.refund'),
    ],
    [
      '@Idempotent on an @EventPattern handler',
      { controllers: [MethodOnEventPattern] },
      methodOnHandler('MethodOnEventPattern.refund'),
    ],
    [
      '@Idempotent on a provider built by useFactory (Nest cannot inject the service into it)',
      {
        providers: [
          {
            provide: 'FACTORY_WORKER',
            useFactory: () => new SupportedWorker(undefined as never),
          },
        ],
      },
      methodOnFactoryProvider('SupportedWorker.process', 'FACTORY_WORKER'),
    ],
  ])('refuses to start with %s, naming Class.method', async (_what, parts, problem) => {
    const failure = await bootFailure(parts);
    expect(failure.message).toBe(unprotectedHandlers([problem]));
    // The wording a developer reads, pinned here as well as in the messages file.
    expect(failure.message).toMatch(
      /^IdempotencyModule refuses to start: these handlers would run unprotected or answer duplicates wrongly:\n {2}- /,
    );
  });

  it('says what to do instead in each refusal', () => {
    expect(gatewayUnsupported('@IdempotentWebhook', 'WebhookOnGateway.pay')).toBe(
      '@IdempotentWebhook on WebhookOnGateway.pay: WebSocket gateways are not supported (a socket message has no redelivery to answer); call IdempotencyService.run() from the handler',
    );
    expect(resolverUnsupported('@IdempotentWebhook', 'WebhookOnResolver.pay')).toContain(
      'call IdempotencyService.run() from the resolver',
    );
    expect(webhookOffHandler('WebhookOnProvider.charge')).toContain('use @Idempotent on provider methods');
    expect(methodOnHandler('MethodOnRoute.refund')).toContain('use @IdempotentWebhook');
  });

  it('lists every problem of an app in one error', async () => {
    const failure = await bootFailure({
      controllers: [MethodOnRoute, MethodOnEventPattern, SupportedController],
      providers: [WebhookOnGateway, MethodOnGateway, WebhookOnResolver, WebhookOnProvider, SupportedWorker],
    });
    const expected = [
      gatewayUnsupported('@IdempotentWebhook', 'WebhookOnGateway.pay'),
      gatewayUnsupported('@Idempotent', 'MethodOnGateway.refund'),
      resolverUnsupported('@IdempotentWebhook', 'WebhookOnResolver.pay'),
      webhookOffHandler('WebhookOnProvider.charge'),
      methodOnHandler('MethodOnRoute.refund'),
      methodOnHandler('MethodOnEventPattern.refund'),
    ];
    const [header, ...lines] = failure.message.split('\n  - ');
    expect(header).toBe(unprotectedHandlers(['x']).split('\n  - ')[0]);
    // The supported handlers in the same app are not listed.
    expect([...lines].sort()).toEqual([...expected].sort());
  });

  describe('an app with every supported kind', () => {
    let app: INestApplication;
    let url: string;
    let microservicePort: number;

    beforeAll(async () => {
      app = await createApp({
        controllers: [SupportedController],
        providers: [SupportedWorker, SupportedGateway],
      });
      microservicePort = await freePort();
      app.connectMicroservice({
        transport: Transport.TCP,
        options: { host: '127.0.0.1', port: microservicePort },
      });
      await app.startAllMicroservices();
      await app.listen(0, '127.0.0.1');
      url = await app.getUrl();
    });

    afterAll(async () => {
      await app?.close();
    });

    const processed = (scope: string, key: string) =>
      db.count(
        `SELECT count(*) FROM processed_events WHERE scope = $1 AND event_key = $2 AND status = 'done'`,
        [scope, key],
      );
    const orders = (key: string) => db.count('SELECT count(*) FROM orders WHERE event_id = $1', [key]);

    it('boots, and its @IdempotentWebhook route claims once', async () => {
      const first = await request(url).post('/orders').send({ id: 'evt_route' });
      expect(first.status).toBe(200);
      expect(first.body).toEqual({ processed: 'evt_route' });
      const again = await request(url).post('/orders').send({ id: 'evt_route' });
      expect(again.status).toBe(200);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(await orders('evt_route')).toBe(1);
      expect(await processed('SupportedController.order', 'evt_route')).toBe(1);
    });

    it('runs its @EventPattern handler over a real TCP transport under a claim', async () => {
      let client: ClientProxy | undefined;
      try {
        client = ClientProxyFactory.create({
          transport: Transport.TCP,
          options: { host: '127.0.0.1', port: microservicePort },
        });
        await client.connect();
        await lastValueFrom(client.emit<unknown, BootEvent>('order.paid', { id: 'evt_event' }), {
          defaultValue: undefined,
        });
        await waitUntil(
          async () => (await processed('SupportedController.paid', 'evt_event')) === 1,
          'the event handler to commit its claim',
        );
      } finally {
        await client?.close();
      }
      expect(await orders('evt_event')).toBe(1);
    });

    it('runs its @Idempotent provider method once per key', async () => {
      const worker = app.get(SupportedWorker);
      await expect(worker.process({ id: 'job_1' })).resolves.toEqual({ processed: 'job_1' });
      await expect(worker.process({ id: 'job_1' })).resolves.toBeUndefined();
      expect(await orders('job_1')).toBe(1);
      expect(await processed('SupportedWorker.process', 'job_1')).toBe(1);
      // A controller's method that is no handler may carry @Idempotent too.
      await app.get(SupportedController).helper({ id: 'helper_1' });
      expect(await processed('SupportedController.helper', 'helper_1')).toBe(1);
    });

    it('runs a gateway that follows the refusal advice (IdempotencyService.run() in the handler)', async () => {
      const socket = new ws.WebSocket(`${url.replace(/^http/, 'ws')}/`);
      const answers: unknown[] = [];
      try {
        await new Promise<void>((resolve, reject) => {
          socket.once('open', () => resolve());
          socket.once('error', reject);
        });
        socket.on('message', (raw: Buffer) => answers.push(JSON.parse(raw.toString('utf8'))));
        socket.send(JSON.stringify({ event: 'pay', data: { id: 'evt_socket' } }));
        await waitUntil(() => answers.length === 1, 'the gateway to answer the first message');
        socket.send(JSON.stringify({ event: 'pay', data: { id: 'evt_socket' } }));
        await waitUntil(() => answers.length === 2, 'the gateway to answer the second message');
      } finally {
        const closed = new Promise((resolve) => socket.once('close', resolve));
        socket.close();
        await closed;
      }
      expect(answers).toEqual([
        { event: 'paid', data: 'processed' },
        { event: 'paid', data: 'replayed' },
      ]);
      expect(await orders('evt_socket')).toBe(1);
      expect(await processed('SupportedGateway.pay', 'evt_socket')).toBe(1);
    });
  });

  describe("the decorators' own arguments, checked when the class is defined", () => {
    const key = (event: BootEvent) => event.id;

    it.each([
      // Instantiated: a union of two generic functions is not callable.
      ['@IdempotentWebhook', IdempotentWebhook<BootEvent>],
      ['@Idempotent', Idempotent<[BootEvent]>],
    ] as const)('%s without a key function throws a TypeError before any app exists', (name, decorator) => {
      for (const options of [undefined, {}, { key: 'id' }]) {
        expect(() => decorator(options as never)).toThrow(TypeError);
        expect(() => decorator(options as never)).toThrow(missingKeyFunction(name));
      }
    });

    it('a bad leaseMs throws when the class is defined', () => {
      const define = () => {
        class BadLease {
          @IdempotentWebhook({ key, external: true, leaseMs: -1 })
          handle() {}
        }
        return BadLease;
      };
      expect(define).toThrow(TypeError);
      expect(define).toThrow(
        badClaimOption('@IdempotentWebhook', 'leaseMs must be a positive number of milliseconds, got -1'),
      );
    });

    it('leaseMs on a transaction-mode @Idempotent method throws when the class is defined', () => {
      const define = () => {
        class LeaseWithoutLease {
          @Idempotent({ key, leaseMs: 5_000 })
          async handle(_event: BootEvent) {}
        }
        return LeaseWithoutLease;
      };
      expect(define).toThrow(
        badClaimOption(
          '@Idempotent',
          "leaseMs and heartbeat belong to external mode; add mode: 'external' or remove them",
        ),
      );
    });

    it.each([
      // Instantiated: a union of two generic functions is not callable.
      ['@IdempotentWebhook', IdempotentWebhook<BootEvent>],
      ['@Idempotent', Idempotent<[BootEvent]>],
    ] as const)('an unknown mode on %s throws when the class is defined', (name, decorator) => {
      const define = () => {
        class UnknownMode {
          @decorator({ key, mode: 'lease' as never })
          async handle(_event: BootEvent) {}
        }
        return UnknownMode;
      };
      expect(define).toThrow(TypeError);
      expect(define).toThrow(
        badClaimOption(name, "mode must be one of 'transaction', 'external', got lease"),
      );
    });
  });
});
