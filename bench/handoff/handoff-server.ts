/**
 * A handoff bench process, forked by run-handoff.ts: BENCH_ROLE=web serves the three routes on a
 * loopback port; BENCH_ROLE=worker runs the worker. Over IPC it answers `{ cmd: 'stats' }` with
 * the worker's job counts and the process's CPU time so far, and `{ cmd: 'shutdown' }` by closing.
 * Environment: BENCH_DATABASE_URL, BENCH_DOWNSTREAM_URL, BENCH_POOL_SIZE, BENCH_ROLE.
 */
import 'reflect-metadata';
import type { INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { HandoffMetrics } from '../../lib/observability/index.js';
import { BENCH_QUEUE, HandoffBenchModule } from './handoff-bench.module.js';

const role = process.env.BENCH_ROLE === 'worker' ? 'worker' : 'web';
const module = HandoffBenchModule.forRoot({
  databaseUrl: process.env.BENCH_DATABASE_URL!,
  downstreamUrl: process.env.BENCH_DOWNSTREAM_URL!,
  poolSize: Number(process.env.BENCH_POOL_SIZE ?? 10),
  role,
});
const options = { logger: ['error' as const, 'warn' as const] };
let url = '';
let app: INestApplicationContext;
if (role === 'web') {
  const web = await NestFactory.create(module, options);
  await web.listen(0, '127.0.0.1');
  url = await web.getUrl();
  app = web;
} else {
  app = await NestFactory.createApplicationContext(module, options);
}
const metrics = app.get(HandoffMetrics);

process.on('message', (message: { id: number; cmd: 'stats' | 'shutdown' }) => {
  if (message.cmd === 'stats') {
    const jobs = metrics.snapshot().jobs[BENCH_QUEUE] ?? {};
    const cpu = process.cpuUsage();
    process.send?.({ id: message.id, jobs, cpuUs: cpu.user + cpu.system });
  } else {
    process.send?.({ id: message.id });
    setImmediate(() => void app.close().finally(() => process.exit(0)));
  }
});
process.on('disconnect', () => void app.close().finally(() => process.exit(0)));
process.send?.({ ready: true, url });
