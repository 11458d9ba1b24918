import type { INestApplication, ModuleMetadata } from '@nestjs/common';
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

/** Boots `imports` on the chosen platform and listens on a free port. */
export async function startApp(
  adapter: AdapterName,
  imports: ModuleMetadata['imports'],
): Promise<RunningApp> {
  const moduleRef = await Test.createTestingModule({ imports }).compile();
  const app =
    adapter === 'fastify'
      ? moduleRef.createNestApplication(new FastifyAdapter(), { logger: false })
      : moduleRef.createNestApplication({ logger: false });
  await app.listen(0, '127.0.0.1');
  if (adapter === 'fastify') await (app.getHttpAdapter().getInstance() as { ready(): Promise<void> }).ready();
  return { app, url: await app.getUrl(), close: () => app.close() };
}
