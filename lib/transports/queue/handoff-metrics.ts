import { loadOptionalPeer } from '../../core/optional-peer.js';
import { Inject, Injectable, type OnModuleInit } from '@nestjs/common';
import { IDEMPOTENCY_CONFIG } from '../../idempotency.constants.js';
import type { IdempotencyConfig, JobOutcome, QueueStats } from '../../interfaces/index.js';

/** The prom-client surface used here, so prom-client stays an optional peer. */
interface PromCounter {
  inc(labels: Record<string, string>): void;
}
interface PromGauge {
  set(labels: Record<string, string>, value: number): void;
}

/** The states of `idempotency_queue_jobs`, from QueueStats. */
const STATES = ['queued', 'retrying', 'active', 'failed', 'deadLettered'] as const;

/**
 * The handoff's numbers: what this process's workers did with jobs (in-process totals, and
 * prom-client's `idempotency_jobs_total{queue,outcome}`), and the queues as the database had them
 * at the last report (`idempotency_queue_jobs{queue,state}`,
 * `idempotency_queue_oldest_waiting_seconds{queue}`). Nothing is registered without `handoff`.
 */
@Injectable()
export class HandoffMetrics implements OnModuleInit {
  private readonly totals = new Map<string, Map<JobOutcome, number>>();
  private readonly queues = new Map<string, QueueStats>();
  private counter?: PromCounter;
  private jobs?: PromGauge;
  private oldest?: PromGauge;

  constructor(@Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig) {}

  async onModuleInit(): Promise<void> {
    if (this.config.handoff === undefined || this.config.prometheus === false) return;
    let prom: typeof import('prom-client');
    try {
      prom = await loadOptionalPeer<typeof import('prom-client')>('prom-client');
    } catch {
      return; // prom-client is optional; without it only snapshot() reports.
    }
    const registers = (
      this.config.prometheus === true ? [prom.register] : this.config.prometheus.registers
    ) as import('prom-client').Registry[];
    // Several apps (tests, workers) may share one registry: reuse a metric registered before.
    const existing = (name: string) => registers[0]?.getSingleMetric(name);
    this.counter = (existing('idempotency_jobs_total') ??
      new prom.Counter({
        name: 'idempotency_jobs_total',
        help: 'Handoff jobs run by this process, by queue and outcome',
        labelNames: ['queue', 'outcome'],
        registers,
      })) as unknown as PromCounter;
    this.jobs = (existing('idempotency_queue_jobs') ??
      new prom.Gauge({
        name: 'idempotency_queue_jobs',
        help: 'Handoff jobs by queue and state, at the last report',
        labelNames: ['queue', 'state'],
        registers,
      })) as unknown as PromGauge;
    this.oldest = (existing('idempotency_queue_oldest_waiting_seconds') ??
      new prom.Gauge({
        name: 'idempotency_queue_oldest_waiting_seconds',
        help: 'Age of the oldest handoff job waiting in each queue, at the last report',
        labelNames: ['queue'],
        registers,
      })) as unknown as PromGauge;
  }

  /** Counts what a worker did with one job. */
  count(outcome: JobOutcome, queue: string): void {
    const byOutcome = this.totals.get(queue) ?? new Map<JobOutcome, number>();
    byOutcome.set(outcome, (byOutcome.get(outcome) ?? 0) + 1);
    this.totals.set(queue, byOutcome);
    this.counter?.inc({ queue, outcome });
  }

  /** Records a queue's figures from the database. */
  setQueueStats(queue: string, stats: QueueStats): void {
    this.queues.set(queue, stats);
    for (const state of STATES) this.jobs?.set({ queue, state: snake(state) }, stats[state]);
    this.oldest?.set({ queue }, stats.oldestWaitingMs / 1000);
  }

  /** In-process totals by queue, and each queue's figures at the last report. */
  snapshot(): {
    jobs: Record<string, Partial<Record<JobOutcome, number>>>;
    queues: Record<string, QueueStats>;
  } {
    const jobs: Record<string, Partial<Record<JobOutcome, number>>> = {};
    for (const [queue, byOutcome] of this.totals) jobs[queue] = Object.fromEntries(byOutcome);
    return { jobs, queues: Object.fromEntries(this.queues) };
  }
}

/** `deadLettered` → `dead_lettered`, as Prometheus label values go. */
function snake(name: string): string {
  return name.replace(/[A-Z]/g, (letter) => `_${letter.toLowerCase()}`);
}
