import type { INestApplication, ModuleMetadata, NestApplicationOptions } from '@nestjs/common';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';

/** The HTTP platforms every e2e test runs on. */
export const ADAPTERS = ['express', 'fastify'] as const;
export type AdapterName = (typeof ADAPTERS)[number];

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
