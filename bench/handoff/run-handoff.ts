/**
 * `npm run bench:handoff [-- --quick]`: acknowledge fast, process once. A downstream that takes
 * 300 ms per call; four routes on one server (express, one pg pool of 10) driven by autocannon
 * at 32 connections, interleaved, reversed every repetition:
 * - floor: a Nest route that answers at once (what a busy machine allows at all);
 * - lib-tx-noop: `@IdempotentWebhook` transaction mode with a no-op handler (the floor);
 * - handoff: transaction mode, `IdempotencyContext.enqueue()` of the downstream call (claim and
 *   job in one COMMIT), answered then;
 * - inline-external: external mode calling the downstream before answering.
 * Then the worker process (external mode, 32 jobs at once) drains the handoff's backlog: its
 * completion rate. Then the handoff route again with the worker running beside it. Writes
 * bench/results/<date>-handoff[-quick].{md,json}. Not a test: figures from a shared 2-core
 * machine are noisy, and the goals are checked and printed, never asserted.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, writeFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { runLoad, type LoadResult } from '../load/load-run.js';
import { keepAliveAgent } from '../load/http-post.js';
import { openLoop } from '../load/open-loop.js';
import { round, summarize } from '../load/percentiles.js';
import { eventIds, stripeEventBody } from '../load/stripe-event.js';
import { createBenchDatabase, startBenchPostgres } from '../support/bench-postgres.js';
import type { Variant } from '../variants.js';
import { SlowDownstream } from './slow-downstream.js';
import { cpuDescription, resultStamp } from '../support/run-identity.js';

const RESULTS_DIR = fileURLToPath(new URL('../../../bench/results/', import.meta.url));
const SERVER_ENTRY = fileURLToPath(new URL('./handoff-server.js', import.meta.url));
const DOWNSTREAM_MS = 300;
const ROUTES = ['floor', 'lib-tx-noop', 'handoff', 'inline-external'] as const;
type Route = (typeof ROUTES)[number];

const quick = process.argv.includes('--quick');
const flag = (name: string, fallback: number) => {
  const index = process.argv.indexOf(`--${name}`);
  return index >= 0 ? Number(process.argv[index + 1]) : fallback;
};
const settings = {
  mode: quick ? 'quick' : 'full',
  connections: flag('connections', 32),
  pool: flag('pool', 10),
  durationS: flag('duration', quick ? 4 : 15),
  reps: flag('reps', quick ? 2 : 3),
  drainS: flag('drain', quick ? 8 : 30),
  workerConcurrency: flag('worker-concurrency', 32),
  /** The open-loop rate of the acknowledgement-latency cells: below inline's ceiling (32 / 0.3 s). */
  rate: flag('rate', 80),
  downstreamMs: DOWNSTREAM_MS,
};

/** A bench process (web or worker), driven over IPC. */
class BenchProcess {
  private nextId = 1;
  private readonly pending = new Map<number, (reply: Record<string, any>) => void>();
  private constructor(
    private readonly child: ChildProcess,
    readonly url: string,
  ) {
    child.on('message', (message: { id?: number }) => {
      if (message.id === undefined) return;
      this.pending.get(message.id)?.(message);
      this.pending.delete(message.id);
    });
  }

  static async start(role: 'web' | 'worker', env: Record<string, string>): Promise<BenchProcess> {
    const child = fork(SERVER_ENTRY, [], {
      env: { ...process.env, ...env, BENCH_ROLE: role, NODE_ENV: 'production' },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const url = await new Promise<string>((resolve, reject) => {
      child.once('message', (message: { url: string }) => resolve(message.url));
      child.once('exit', (code) =>
        reject(new Error(`bench ${role} exited with ${code} before it was ready`)),
      );
    });
    return new BenchProcess(child, url);
  }

  request(cmd: 'stats' | 'shutdown'): Promise<Record<string, any>> {
    const id = this.nextId++;
    return new Promise((resolve) => {
      this.pending.set(id, resolve);
      this.child.send({ id, cmd });
    });
  }

  async stop(): Promise<void> {
    const exited = new Promise((done) => this.child.once('exit', done));
    await this.request('shutdown');
    await exited;
  }
}

/** One measured load run, as reported. */
interface Cell {
  route: Route;
  rep: number;
  eventsPerSecond: number;
  p50: number;
  p99: number;
  max: number;
  responses: number;
  non2xx: number;
  errors: number;
  /** The web server's CPU time (user + system) per answered request, in µs. */
  serverCpuUsPerEvent: number;
}

const cell = (route: Route, rep: number, result: LoadResult, cpuUs: number): Cell => ({
  route,
  rep,
  eventsPerSecond: result.eventsPerSecond,
  p50: result.latencyMs.p50,
  p99: result.latencyMs.p99,
  max: result.latencyMs.max,
  responses: result.responses,
  non2xx: result.non2xx,
  errors: result.errors,
  serverCpuUsPerEvent: result.responses ? Math.round(cpuUs / result.responses) : 0,
});

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return round(sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2, 3);
};

const stamp = resultStamp();
const name = `${stamp}-handoff${quick ? '-quick' : ''}`;
const runTag = randomBytes(3).toString('hex');
await mkdir(RESULTS_DIR, { recursive: true });

const postgres = await startBenchPostgres();
const downstream = await SlowDownstream.start(DOWNSTREAM_MS);
const processes: BenchProcess[] = [];
try {
  const environment = {
    node: process.version,
    cpu: cpuDescription(),
    'load average at start': loadavg()[0].toFixed(2),
    database: postgres.description,
  };
  const database = await createBenchDatabase(postgres.adminUrl);
  const env = {
    BENCH_DATABASE_URL: database.url,
    BENCH_DOWNSTREAM_URL: downstream.url,
    BENCH_POOL_SIZE: String(settings.pool),
    BENCH_WORKER_CONCURRENCY: String(settings.workerConcurrency),
  };
  const web = await BenchProcess.start('web', env);
  processes.push(web);
  const load = (route: Route, cellTag: string, durationS: number) =>
    runLoad({
      url: web.url,
      // The handoff routes are not the main bench's variants; runLoad only puts the name in the path.
      variant: route as unknown as Variant,
      workload: 'unique',
      durationS,
      connections: settings.connections,
      nextId: eventIds(runTag, cellTag).next,
    });

  const agent = keepAliveAgent(settings.connections);
  /** Open loop at settings.rate, evenly spaced (see openLoop), as a LoadResult. */
  const steady = async (route: Route, cellTag: string, durationS: number): Promise<LoadResult> => {
    const ids = eventIds(runTag, cellTag);
    const answers = await openLoop({
      agent,
      url: web.url,
      path: `/${route}`,
      rate: settings.rate,
      ms: durationS * 1000,
      body: (sequence) => stripeEventBody(ids.next(), sequence),
    });
    const failed = answers.filter((answer) => answer.status === 0).length;
    return {
      durationS,
      responses: answers.length - failed,
      eventsPerSecond: round((answers.length - failed) / durationS),
      latencyMs: summarize(answers.map((answer) => answer.ms)),
      statuses: {},
      errors: failed,
      timeouts: 0,
      non2xx: answers.filter((answer) => answer.status !== 0 && (answer.status < 200 || answer.status >= 300))
        .length,
      duplicatesSent: 0,
      answeredIds: [],
    };
  };

  console.log(`[handoff bench] ${settings.mode}: warming up`);
  for (const [index, route] of ROUTES.entries()) await load(route, `w${index}`, 1);

  // Phase 1: acknowledgements, no worker running (the backlog waits).
  const cells: Cell[] = [];
  for (let rep = 1; rep <= settings.reps; rep++) {
    const order = rep % 2 === 1 ? ROUTES : [...ROUTES].reverse();
    for (const route of order) {
      const cpuBefore = Number((await web.request('stats')).cpuUs);
      const result = await load(route, `r${rep}${ROUTES.indexOf(route)}`, settings.durationS);
      const cpuUs = Number((await web.request('stats')).cpuUs) - cpuBefore;
      cells.push(cell(route, rep, result, cpuUs));
      console.log(
        `[handoff bench] rep ${rep} ${route}: ${result.eventsPerSecond} events/s, ack p50 ${result.latencyMs.p50} ms, p99 ${result.latencyMs.p99} ms, server CPU ${cells.at(-1)!.serverCpuUsPerEvent} µs/event`,
      );
    }
  }

  // Phase 1b: acknowledgement latency at a steady rate every route can sustain, as a sender sees
  // it; the closed-loop cells above saturate the server, so their latency is mostly queueing.
  const rateCells: Cell[] = [];
  for (let rep = 1; rep <= settings.reps; rep++) {
    const order = rep % 2 === 1 ? ROUTES : [...ROUTES].reverse();
    for (const route of order) {
      const cpuBefore = Number((await web.request('stats')).cpuUs);
      const result = await steady(route, `f${rep}${ROUTES.indexOf(route)}`, settings.durationS);
      rateCells.push(cell(route, rep, result, Number((await web.request('stats')).cpuUs) - cpuBefore));
      console.log(
        `[handoff bench] rep ${rep} ${route} at ${settings.rate}/s: ack p50 ${result.latencyMs.p50} ms, p99 ${result.latencyMs.p99} ms`,
      );
    }
  }

  agent.destroy();

  // Phase 2: the worker drains the backlog; its completion rate.
  const admin = new pg.Pool({ connectionString: database.url, max: 2 });
  const waiting = async () =>
    Number(
      (
        await admin.query(
          `SELECT count(*) AS n FROM pgboss.job WHERE name = 'bench-downstream' AND state < 'active'`,
        )
      ).rows[0].n,
    );
  const backlog = await waiting();
  const worker = await BenchProcess.start('worker', env);
  processes.push(worker);
  const completedNow = async () => Number((await worker.request('stats')).jobs.completed ?? 0);
  // The first seconds ramp up (polling, connections): measured from the first completion on.
  const rampDeadline = Date.now() + 10_000;
  while ((await completedNow()) === 0 && Date.now() < rampDeadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const drainStart = { at: performance.now(), done: await completedNow(), calls: downstream.calls };
  await new Promise((resolve) => setTimeout(resolve, settings.drainS * 1000));
  const drainEnd = { at: performance.now(), done: await completedNow(), calls: downstream.calls };
  const drainSeconds = (drainEnd.at - drainStart.at) / 1000;
  const completionRate = round((drainEnd.done - drainStart.done) / drainSeconds, 1);
  const ceiling = round(settings.workerConcurrency / (DOWNSTREAM_MS / 1000), 1);
  console.log(
    `[handoff bench] worker: ${completionRate} jobs/s over ${round(drainSeconds, 1)} s (ceiling ${ceiling}: ${settings.workerConcurrency} at once × 300 ms), backlog was ${backlog}`,
  );

  // Phase 3: the handoff route with the worker running beside it.
  const besideStart = await completedNow();
  const besideAt = performance.now();
  const besideCpu = Number((await web.request('stats')).cpuUs);
  const beside = await load('handoff', 'b0', settings.durationS);
  const besideCell = cell('handoff', 0, beside, Number((await web.request('stats')).cpuUs) - besideCpu);
  const besideRate = round(
    ((await completedNow()) - besideStart) / ((performance.now() - besideAt) / 1000),
    1,
  );
  const backlogAfter = await waiting();
  await admin.end();

  const summary = Object.fromEntries(
    ROUTES.map((route) => {
      const mine = cells.filter((c) => c.route === route);
      return [
        route,
        {
          eventsPerSecond: median(mine.map((c) => c.eventsPerSecond)),
          p50: median(mine.map((c) => c.p50)),
          p99: median(mine.map((c) => c.p99)),
          serverCpuUsPerEvent: median(mine.map((c) => c.serverCpuUsPerEvent)),
          non2xx: mine.reduce((sum, c) => sum + c.non2xx, 0),
          errors: mine.reduce((sum, c) => sum + c.errors, 0),
        },
      ];
    }),
  ) as Record<
    Route,
    {
      eventsPerSecond: number;
      p50: number;
      p99: number;
      serverCpuUsPerEvent: number;
      non2xx: number;
      errors: number;
    }
  >;
  const atRate = Object.fromEntries(
    ROUTES.map((route) => {
      const mine = rateCells.filter((c) => c.route === route);
      return [
        route,
        {
          eventsPerSecond: median(mine.map((c) => c.eventsPerSecond)),
          p50: median(mine.map((c) => c.p50)),
          p99: median(mine.map((c) => c.p99)),
          non2xx: mine.reduce((sum, c) => sum + c.non2xx, 0),
        },
      ];
    }),
  ) as Record<Route, { eventsPerSecond: number; p50: number; p99: number; non2xx: number }>;
  const ratios = Array.from({ length: settings.reps }, (_, index) => {
    const of = (route: Route) => cells.find((c) => c.rep === index + 1 && c.route === route)!.eventsPerSecond;
    return round(of('handoff') / of('lib-tx-noop'), 3);
  });
  const goals = {
    [`handoff ack p99 < 20 ms (at ${settings.rate} events/s)`]: atRate.handoff.p99 < 20,
    [`inline-external ack p99 > 300 ms (at ${settings.rate} events/s)`]: atRate['inline-external'].p99 > 300,
    'handoff ack p99 < 20 ms (32 connections, closed loop)': summary.handoff.p99 < 20,
    'handoff events/s ≥ 0.9 × lib-tx-noop': median(ratios) >= 0.9,
  };
  const result = {
    name,
    generatedAt: new Date().toISOString(),
    settings,
    environment,
    summary,
    atRate,
    throughputRatio: { 'handoff/lib-tx-noop': { median: median(ratios), reps: ratios } },
    cells,
    rateCells,
    worker: {
      backlog,
      completionRate,
      seconds: round(drainSeconds, 1),
      ceiling,
      downstreamCalls: drainEnd.calls - drainStart.calls,
    },
    handoffBesideWorker: { ...besideCell, workerCompletionRate: besideRate, backlogAfter },
    goals,
  };

  await writeFile(join(RESULTS_DIR, `${name}.json`), `${JSON.stringify(result, null, 2)}\n`);
  await writeFile(join(RESULTS_DIR, `${name}.md`), markdown(result));
  console.log(`[handoff bench] wrote bench/results/${name}.{md,json}`);
  for (const [goal, met] of Object.entries(goals))
    console.log(`[handoff bench] ${met ? 'met' : 'MISSED'}: ${goal}`);
} finally {
  for (const child of processes.reverse()) await child.stop().catch(() => undefined);
  await downstream.close();
  await postgres.stop();
}

function markdown(result: Record<string, any>): string {
  const s = result.summary as Record<
    Route,
    { eventsPerSecond: number; p50: number; p99: number; serverCpuUsPerEvent: number; non2xx: number }
  >;
  const row = (route: Route, what: string) =>
    `| ${route} | ${what} | ${s[route].eventsPerSecond} | ${s[route].p50} | ${s[route].p99} | ${s[route].serverCpuUsPerEvent} | ${s[route].non2xx} |`;
  const lines = [
    `# Handoff bench: ${result.name}`,
    '',
    `${result.settings.mode} run, ${result.generatedAt}. Downstream: ${DOWNSTREAM_MS} ms per call. ` +
      `${result.settings.connections} connections, pool ${result.settings.pool}, ${result.settings.durationS} s per cell, ` +
      `${result.settings.reps} repetitions interleaved (order reversed every repetition); medians below. ` +
      'First closed loop (each connection sends again as soon as it is answered: the server saturates, and latency is mostly queueing):',
    '',
    `Environment: ${Object.entries(result.environment)
      .map(([key, value]) => `${key} ${value}`)
      .join(', ')}. A shared 2-core machine: other work ran beside the bench, so figures are noisy.`,
    '',
    '| route | what it does | events/s | ack p50 (ms) | ack p99 (ms) | server CPU (µs/event) | non-2xx |',
    '| --- | --- | ---: | ---: | ---: | ---: | ---: |',
    row('floor', 'a Nest route answering at once, no database (what the machine allows)'),
    row('lib-tx-noop', 'transaction mode, no-op handler'),
    row('handoff', 'claim + job in one COMMIT, then 200'),
    row('inline-external', 'external mode, calls the downstream, then 200'),
    '',
    `At a steady ${result.settings.rate} events/s (open loop, evenly spaced; each latency from when its request was due), the acknowledgement as a sender sees it:`,
    '',
    '| route | ack p50 (ms) | ack p99 (ms) | events/s | non-2xx |',
    '| --- | ---: | ---: | ---: | ---: |',
    ...ROUTES.map(
      (route) =>
        `| ${route} | ${result.atRate[route].p50} | ${result.atRate[route].p99} | ${result.atRate[route].eventsPerSecond} | ${result.atRate[route].non2xx} |`,
    ),
    '',
    `handoff / lib-tx-noop throughput: median ${result.throughputRatio['handoff/lib-tx-noop'].median} ` +
      `(per repetition: ${result.throughputRatio['handoff/lib-tx-noop'].reps.join(', ')}).`,
    '',
    `Worker (external mode, ${result.settings.workerConcurrency} jobs at once, separate process): ` +
      `${result.worker.completionRate} jobs/s over ${result.worker.seconds} s draining a backlog of ${result.worker.backlog} ` +
      `(ceiling ${result.worker.ceiling} jobs/s: ${result.settings.workerConcurrency} × 1 / 0.3 s).`,
    '',
    `Handoff with the worker running beside it: ${result.handoffBesideWorker.eventsPerSecond} events/s, ack p50 ` +
      `${result.handoffBesideWorker.p50} ms, p99 ${result.handoffBesideWorker.p99} ms; the worker completed ` +
      `${result.handoffBesideWorker.workerCompletionRate} jobs/s meanwhile; ${result.handoffBesideWorker.backlogAfter} jobs still waiting after.`,
    '',
    '## Goals',
    '',
    ...Object.entries(result.goals).map(([goal, met]) => `- ${met ? 'met' : 'missed'}: ${goal}`),
    '',
    '## Every cell',
    '',
    '| rep | route | events/s | p50 | p99 | max | server CPU µs/event | responses | non-2xx | errors |',
    '| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    ...(result.cells as Cell[]).map(
      (c) =>
        `| ${c.rep} | ${c.route} | ${c.eventsPerSecond} | ${c.p50} | ${c.p99} | ${c.max} | ${c.serverCpuUsPerEvent} | ${c.responses} | ${c.non2xx} | ${c.errors} |`,
    ),
    '',
  ];
  return lines.join('\n');
}
