import type { AddressInfo, Server as NetServer } from 'node:net';
import { resolve } from 'node:path';
import type { INestMicroservice, LoggerService } from '@nestjs/common';
import {
  ClientProxyFactory,
  Transport,
  type ClientProxy,
  type MicroserviceOptions,
} from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { lastValueFrom, Observable, timeout, toArray } from 'rxjs';
import { microserviceFixtureModule, MICROSERVICE_PATTERNS } from '../fixtures/microservice.fixture.js';
import type { FixtureSettings } from '../fixtures/webhook-fixture.module.js';
import { forkGatedChild } from './gated-child.js';
import { testRedis } from './redis-server.js';
import { waitUntil } from './wait-until.js';

/** The @nestjs/microservices transports every microservice e2e test runs on. */
export const TRANSPORTS = ['tcp', 'redis'] as const;
export type TransportName = (typeof TRANSPORTS)[number];

/** Settings of a fixture microservice: its database and library options. */
export type MicroserviceSettings = Omit<FixtureSettings, 'controllers'>;

/** The fixture's channels: on Redis, each handler's pattern is a channel the server subscribes to. */
const CHANNELS: string[] = Object.values(MICROSERVICE_PATTERNS);

/** A bound for each wait on the transport: milliseconds when things work. */
const TRANSPORT_DEADLINE_MS = 10_000;

/**
 * The server's options. TCP listens on port 0 (the kernel picks a free port at bind, so two
 * workers cannot race for one); Redis uses the run's redis-server on loopback.
 */
export function serverOptions(transport: TransportName): MicroserviceOptions {
  if (transport === 'tcp') return { transport: Transport.TCP, options: { host: '127.0.0.1', port: 0 } };
  return { transport: Transport.REDIS, options: redisAddress() };
}

/** The run's Redis server, as ioredis options. */
function redisAddress(): { host: string; port: number } {
  const { host, port } = testRedis();
  return { host, port };
}

/** A connected client of a microservice: `port` is the TCP server's (Redis needs none). */
export async function connectClient(transport: TransportName, port?: number): Promise<ClientProxy> {
  const client =
    transport === 'tcp'
      ? ClientProxyFactory.create({ transport: Transport.TCP, options: { host: '127.0.0.1', port } })
      : ClientProxyFactory.create({ transport: Transport.REDIS, options: redisAddress() });
  await client.connect();
  return client;
}

/**
 * Each fixture server's subscriptions to the fixture's channels on Redis; 0 on TCP. Read it only
 * while no fixture server is starting or closing (one subscribes to all channels at once).
 */
export async function subscribers(transport: TransportName): Promise<number> {
  if (transport !== 'redis') return 0;
  return Math.max(...(await withRedis(numsub)));
}

/**
 * On Redis, waits until exactly `count` servers subscribe to each of the fixture's channels.
 * ServerRedis sends SUBSCRIBE without waiting for the answer before `listen()` resolves, and a
 * message published before the subscription is active is dropped: a test would wait for an
 * effect that can never come. After a close or a kill, the lower count makes sure the old server
 * is gone and will not take a message meant for the next one. A no-op on TCP.
 */
export async function waitForSubscribers(transport: TransportName, count: number): Promise<void> {
  if (transport !== 'redis') return;
  await withRedis((redis) =>
    waitUntil(
      async () => (await numsub(redis)).every((subscribed) => subscribed === count),
      `${count} Redis subscriber(s) on each of ${CHANNELS.join(', ')}`,
      TRANSPORT_DEADLINE_MS,
      20,
    ),
  );
}

/** Subscribers of each fixture channel. */
async function numsub(redis: Redis): Promise<number[]> {
  const reply = (await redis.pubsub('NUMSUB', ...CHANNELS)) as (string | number)[];
  // [channel, count, channel, count, ...]
  return reply.filter((_, index) => index % 2 === 1).map(Number);
}

/** Runs `work` on a Redis connection of its own, closed after. */
async function withRedis<T>(work: (redis: Redis) => Promise<T>): Promise<T> {
  const redis = new Redis({ ...redisAddress(), lazyConnect: true, maxRetriesPerRequest: 1 });
  try {
    await redis.connect();
    return await work(redis);
  } finally {
    await redis.quit().catch(() => redis.disconnect());
  }
}

/** A fixture microservice in this process, listening, with a client connected to it. */
export interface RunningMicroservice {
  app: INestMicroservice;
  client: ClientProxy;
  /** Closes the client, then the microservice; on Redis, waits until its subscriptions are gone. */
  close(): Promise<void>;
}

/**
 * Boots the fixture microservice on `transport` and connects a client to it. On Redis, several
 * may run at once (each receives every message: pub/sub fans out); start and close them one at
 * a time, since each waits for the subscriber count to move by one.
 */
export async function startMicroservice(
  transport: TransportName,
  settings: MicroserviceSettings,
  logger?: LoggerService,
): Promise<RunningMicroservice> {
  const moduleRef = await Test.createTestingModule({
    imports: [microserviceFixtureModule(settings)],
  }).compile();
  const app = moduleRef.createNestMicroservice<MicroserviceOptions>({
    ...serverOptions(transport),
    logger: false,
  });
  if (logger) app.useLogger(logger);
  const others = await subscribers(transport);
  await app.listen();
  await waitForSubscribers(transport, others + 1);
  const port = transport === 'tcp' ? (app.unwrap<NetServer>().address() as AddressInfo).port : undefined;
  const client = await connectClient(transport, port);
  return {
    app,
    client,
    async close() {
      const subscribed = await subscribers(transport);
      await client.close();
      await app.close();
      await waitForSubscribers(transport, subscribed - 1);
    },
  };
}

/** A fixture microservice in a child process: the thing crash tests SIGKILL. */
export interface ChildMicroservice {
  /** A client connected to it (on Redis: to the run's server, which reaches whoever subscribes). */
  client: ClientProxy;
  /** Everything the child wrote to stdout and stderr so far (its Nest logs). */
  output(): string;
  /** Resolves when a handler for `id` has claimed and reached its gate in the child. */
  entered(id: string): Promise<void>;
  /** SIGKILL: no shutdown hooks, no rollback from the app; Postgres sees the connection die. */
  kill(): Promise<void>;
  /** Graceful stop (SIGTERM), for children the test is done with. */
  stop(): Promise<void>;
}

const CHILD_ENTRY = resolve('dist/test/fixtures/microservice-child.js');
/** A Nest boot in a fresh Node process, on a busy 2-core machine: seconds, not milliseconds. */
const CHILD_BOOT_MS = 30_000;

/**
 * Starts the fixture microservice in a child process (from dist/, built by `npm run build`) and
 * connects a client once it listens (and, on Redis, once it has subscribed).
 */
export async function startChildMicroservice(
  transport: TransportName,
  settings: MicroserviceSettings,
): Promise<ChildMicroservice> {
  const others = await subscribers(transport);
  const child = await forkGatedChild<number>({
    entry: CHILD_ENTRY,
    env: { MICROSERVICE_SETTINGS: JSON.stringify({ fixture: settings, server: serverOptions(transport) }) },
    name: 'microservice child',
    readyTimeoutMs: CHILD_BOOT_MS,
  });
  let client: ClientProxy;
  try {
    await waitForSubscribers(transport, others + 1);
    client = await connectClient(transport, child.ready);
  } catch (error) {
    await child.kill();
    throw error;
  }
  const connected = client;

  // Once only: a test kills the child, and afterEach stops whatever it started.
  let ending: Promise<void> | undefined;
  const end = (kill: () => Promise<void>) =>
    (ending ??= (async () => {
      // A child that died on its own took its subscriptions along (or will): back to the count before it.
      const remaining = child.ended() ? others : (await subscribers(transport)) - 1;
      // The child goes while its client is still connected, as a crash would find it.
      await kill();
      await connected.close();
      await waitForSubscribers(transport, remaining);
    })());
  return {
    client: connected,
    output: child.output,
    entered: (id) => child.entered(id),
    kill: () => end(child.kill),
    stop: () => end(child.stop),
  };
}

/**
 * What a caller observed from `send()` or `emit()`: every value it emitted before completing, or
 * its error. Bounded: a message nobody answers rejects with rxjs' TimeoutError naming the wait.
 */
export type Observed = { values: unknown[] } | { error: unknown };

/** Subscribes to `reply` and resolves with what it emitted, or its error, within `timeoutMs`. */
export function observe(reply: Observable<unknown>, timeoutMs = TRANSPORT_DEADLINE_MS): Promise<Observed> {
  return lastValueFrom(reply.pipe(timeout({ each: timeoutMs }), toArray())).then(
    (values) => ({ values }),
    (error: unknown) => ({ error }),
  );
}
