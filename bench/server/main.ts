import 'reflect-metadata';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import type pg from 'pg';
import type { ServerCommand, ServerReady, ServerReply, ServerStats } from '../support/server-protocol.js';
import { BENCH_POOL } from './bench.controller.js';
import { BenchModule } from './bench.module.js';
import { countRequestsOf, startAsyncCount, stopAsyncCount } from './async-counter.js';
import { startCpuProfile, stopCpuProfile } from './cpu-profiler.js';
import {
  installQueryCounter,
  queryCounts,
  resetQueryCounts,
  startTrace,
  stopTrace,
} from './query-counter.js';

/**
 * The bench server: one Nest app serving every variant, run in its own process (forked by
 * bench/run.ts, which is also the load generator) and driven over the IPC channel.
 * Environment: BENCH_DATABASE_URL, BENCH_ADAPTER (express | fastify), BENCH_POOL_SIZE,
 * BENCH_DUPLICATE_WAIT_MS and BENCH_PREPARED_STATEMENTS (true | false | auto; optional).
 */
installQueryCounter(); // before the pool opens its first connection

const adapter = process.env.BENCH_ADAPTER === 'fastify' ? 'fastify' : 'express';
const module = BenchModule.forRoot({
  databaseUrl: required('BENCH_DATABASE_URL'),
  poolSize: Number(process.env.BENCH_POOL_SIZE ?? 10),
  duplicateWaitMs: process.env.BENCH_DUPLICATE_WAIT_MS
    ? Number(process.env.BENCH_DUPLICATE_WAIT_MS)
    : undefined,
  preparedStatements: preparedStatements(process.env.BENCH_PREPARED_STATEMENTS),
});
const options = { logger: ['error' as const, 'warn' as const] };
const app: INestApplication =
  adapter === 'fastify'
    ? await NestFactory.create(module, new FastifyAdapter(), options)
    : await NestFactory.create(module, options);
await app.listen(0, '127.0.0.1');
if (adapter === 'fastify') await (app.getHttpAdapter().getInstance() as { ready(): Promise<void> }).ready();
const pool = app.get<pg.Pool>(BENCH_POOL);

// Counted at the HTTP server, below either adapter, so "per event" means per answered request.
let requests = 0;
let answered = 0;
let inFlight = 0;
let statuses: Record<string, number> = {};
(app.getHttpServer() as Server).on('request', (_request: IncomingMessage, response: ServerResponse) => {
  requests++;
  inFlight++;
  response.once('close', () => {
    inFlight--;
    if (!response.writableFinished) return;
    answered++;
    statuses[response.statusCode] = (statuses[response.statusCode] ?? 0) + 1;
  });
});
countRequestsOf(app.getHttpServer() as Server);
let cpuSince = process.cpuUsage();
let since = performance.now();

function stats(): ServerStats {
  const cpu = process.cpuUsage(cpuSince);
  return {
    queries: queryCounts(),
    requests,
    answered,
    inFlight,
    statuses: { ...statuses },
    cpuUserUs: cpu.user,
    cpuSystemUs: cpu.system,
    elapsedMs: performance.now() - since,
    pool: { total: pool.totalCount, idle: pool.idleCount, waiting: pool.waitingCount },
  };
}

async function handle(command: ServerCommand): Promise<Omit<ServerReply, 'id'>> {
  switch (command.cmd) {
    case 'reset':
      resetQueryCounts();
      requests = answered = 0;
      statuses = {};
      cpuSince = process.cpuUsage();
      since = performance.now();
      return {};
    case 'stats':
      return { stats: stats() };
    case 'trace-start':
      startTrace();
      return {};
    case 'trace-stop':
      return { trace: stopTrace() };
    case 'count-start':
      startAsyncCount();
      return {};
    case 'count-stop':
      return { asyncCounts: stopAsyncCount() };
    case 'profile-start':
      await startCpuProfile();
      return {};
    case 'profile-stop':
      await stopCpuProfile(command.path);
      return {};
    case 'shutdown':
      setImmediate(() => void app.close().finally(() => process.exit(0)));
      return {};
  }
}

process.on('message', (message: ServerCommand & { id: number }) => {
  handle(message).then(
    (reply) => process.send?.({ id: message.id, ...reply } satisfies ServerReply),
    (error: unknown) => process.send?.({ id: message.id, error: String(error) } satisfies ServerReply),
  );
});
// The runner going away (crash, Ctrl-C) must not leave a server holding database connections.
process.on('disconnect', () => void app.close().finally(() => process.exit(0)));
process.send?.({ ready: true, url: await app.getUrl() } satisfies ServerReady);

function preparedStatements(value: string | undefined): boolean | 'auto' | undefined {
  if (!value) return undefined;
  if (value === 'auto') return value;
  if (value === 'true' || value === 'false') return value === 'true';
  throw new Error(`BENCH_PREPARED_STATEMENTS must be true, false or auto, not ${value}`);
}

function required(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: the bench server is started by bench/run.ts`);
  return value;
}
