import type { INestApplication, ModuleMetadata, NestApplicationOptions } from '@nestjs/common';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';

/**
 * The two HTTP platforms. Which of them a suite runs on follows what the suite is about.
 *
 * What differs between Express and Fastify in the library is small: setting a header
 * (`Retry-After`, `Idempotent-Replayed`) through Nest's adapter, body parsing and raw bodies (the
 * signature guards), the status codes and bodies each platform writes for an exception or a bad
 * request, and `@Res()` passthrough. A suite whose subject is one of these, an HTTP answer, runs on
 * both: `describe.each(ADAPTERS)` (bad input, signature guards, HTTP exceptions, Retry-After,
 * refusals, handler arguments, stacked decorators, the transaction mode's answers, the testing
 * helpers over HTTP, ClsModule's mounts).
 *
 * A suite whose subject lies below HTTP (the claim, the lease, the database and its failures,
 * crashes, the reporter, the operator, claims inside a delivery, metrics, the handoff) gives the
 * same answer on either platform: it runs once, on the one `onAdapter()` names. Those suites are
 * split between the two, so each platform still carries traffic of every kind (transaction and
 * external mode, crashes, outages, the pooler route).
 */
export const ADAPTERS = ['express', 'fastify'] as const;
export type AdapterName = (typeof ADAPTERS)[number];

/**
 * The one platform of a suite whose subject is not HTTP (see ADAPTERS), for `describe.each`: the
 * suite's name still says which platform it ran on.
 */
export function onAdapter(adapter: AdapterName): readonly [AdapterName] {
  return [adapter];
}

/** A real Nest app listening on a loopback port. */
export interface RunningApp {
  app: INestApplication;
  url: string;
  close(): Promise<void>;
}

/**
 * Boots `imports` on the chosen platform and listens on a free port. `options` are the app's
 * (e.g. `{ rawBody: true }`); the logger stays off unless they say otherwise.
 */
export async function startApp(
  adapter: AdapterName,
  imports: ModuleMetadata['imports'],
  options: NestApplicationOptions = {},
): Promise<RunningApp> {
  const moduleRef = await Test.createTestingModule({ imports }).compile();
  const appOptions = { logger: false as const, ...options };
  const app =
    adapter === 'fastify'
      ? moduleRef.createNestApplication(new FastifyAdapter(), appOptions)
      : moduleRef.createNestApplication(appOptions);
  await app.listen(0, '127.0.0.1');
  if (adapter === 'fastify') await (app.getHttpAdapter().getInstance() as { ready(): Promise<void> }).ready();
  return { app, url: await app.getUrl(), close: () => app.close() };
}
