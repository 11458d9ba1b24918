import { prometheusMetrics, type PromCounter, type PromGauge } from '../../core/prometheus-metrics.js';
import { Inject, Injectable, type OnModuleInit } from '@nestjs/common';
import { IDEMPOTENCY_CONFIG } from '../../idempotency.constants.js';
import type { IdempotencyConfig, JobOutcome, QueueStats } from '../../interfaces/index.js';

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
    if (this.config.handoff === undefined) return;
    const prom = await prometheusMetrics(this.config.prometheus);
    if (!prom) return; // Without prom-client only snapshot() reports.
    this.counter = prom.counter(
      'idempotency_jobs_total',
      'Handoff jobs run by this process, by queue and outcome',
      ['queue', 'outcome'],
    );
    this.jobs = prom.gauge('idempotency_queue_jobs', 'Handoff jobs by queue and state, at the last report', [
      'queue',
      'state',
    ]);
    this.oldest = prom.gauge(
      'idempotency_queue_oldest_waiting_seconds',
      'Age of the oldest handoff job waiting in each queue, at the last report',
      ['queue'],
    );
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
