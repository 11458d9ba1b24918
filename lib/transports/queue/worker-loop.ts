import type { Logger } from '@nestjs/common';
import type { ClaimResult } from '../../core/claim-result.js';
import type { ClaimRunner } from '../../core/claim-runner.js';
import { pgBossFailed } from '../../idempotency.messages.js';
import type { HandoffJob } from '../../interfaces/index.js';
import type { HandoffMetrics } from './handoff-metrics.js';
import { jobKeyOf, readHandoffPayload } from './handoff-payload.js';
import type { IdempotentWorkerMetadata } from './idempotent-worker.decorator.js';
import type { PgBoss, PgBossJob } from './pg-boss.js';
import { describeError } from '../../idempotency.messages.js';

const jobNotHandedOff = (queue: string, id: string) =>
  `Job ${id} of queue ${queue} carries no event key, or a malformed job key (it was not enqueued through IdempotencyContext.enqueue()): failed without running`;

const jobFailed = (
  queue: string,
  id: string,
  key: string,
  attempt: number,
  retrying: boolean,
  error: unknown,
) =>
  `Job ${id} of queue ${queue} (${key}) failed on attempt ${attempt}: ${describeError(error)}; ${retrying ? 'pg-boss retries it after its backoff' : 'no retries left, it goes to the dead-letter queue'}`;

const jobInFlight = (queue: string, key: string) =>
  `Key ${key} of queue ${queue} is being processed by another job or worker; this job is retried after its backoff`;

const jobReplayed = (queue: string, id: string, key: string, scope: string) =>
  key === id
    ? `Job ${id} of queue ${queue} was completed without running again: ${scope} already ran it (pg-boss handed it out again after its effect was recorded)`
    : `Job ${id} of queue ${queue} was completed without running: ${scope} already ran a job with key ${key} (enqueue()'s key, or the job this one is a copy of)`;

const jobSettleFailed = (queue: string, id: string, what: string, error: unknown) =>
  `Could not mark job ${id} of queue ${queue} ${what}: ${describeError(error)}; pg-boss hands it out again once it expires, and its claim answers it without running it twice`;

/** One `@IdempotentWorker` method, found on its provider's instance. */
export interface WorkerRegistration extends IdempotentWorkerMetadata {
  /** `Class.method`, for messages. */
  where: string;
  /** Calls the method on its instance. */
  call: (job: HandoffJob) => unknown;
}

/** What a WorkerLoop needs from the handoff. */
export interface WorkerLoopDeps {
  boss: PgBoss;
  runner: ClaimRunner;
  metrics: HandoffMetrics;
  logger: Logger;
  pollingIntervalMs: number;
}

/**
 * Fetches one worker's jobs and runs each under its claim, `concurrency` at a time. pg-boss 10
 * has no worker that runs inside a caller's transaction, so this loop is the handoff's own: it
 * fetches (autocommitted: the job is marked active and its retry counted, as pg-boss's own
 * work() does), then runs the method in the claim's transaction and completes the job through
 * that same transaction (transaction mode), or completes it once the lease is marked done
 * (external mode). A failure fails the job, autocommitted, so pg-boss's retries and dead letter
 * apply. Each turn awaits a fetch, a finished job or the polling interval, and stop() ends it.
 */
export class WorkerLoop {
  private readonly running = new Set<Promise<void>>();
  private stopping = false;
  private wake?: () => void;
  private loop?: Promise<void>;

  constructor(
    private readonly worker: WorkerRegistration,
    private readonly deps: WorkerLoopDeps,
  ) {}

  start(): void {
    this.loop ??= this.fetchLoop();
  }

  /**
   * Stops fetching and waits up to `drainMs` for the running jobs; resolves with how many are
   * still running then (left for pg-boss to hand out again once they expire).
   */
  async stop(drainMs: number): Promise<number> {
    this.stopping = true;
    this.wake?.();
    // The loop ends at its next turn: after a fetch, a finished job or the woken idle wait.
    const drained = (async () => {
      await this.loop;
      await Promise.all(this.running);
      return true;
    })();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), drainMs)));
    const finished = await Promise.race([drained, timedOut]);
    clearTimeout(timer);
    return finished ? 0 : this.running.size;
  }

  private async fetchLoop(): Promise<void> {
    const { boss, logger } = this.deps;
    const { queue, concurrency } = this.worker;
    while (!this.stopping) {
      if (this.running.size >= concurrency) {
        await Promise.race(this.running);
        continue;
      }
      let jobs: PgBossJob[] = [];
      try {
        jobs =
          (await boss.fetch(queue, { batchSize: concurrency - this.running.size, includeMetadata: true })) ??
          [];
      } catch (error) {
        logger.error(pgBossFailed(error));
      }
      // Fetched jobs are active now: they run even when stop() came meanwhile, and count for its drain.
      for (const job of jobs) {
        const run: Promise<void> = this.run(job)
          .catch((error: unknown) => logger.error(pgBossFailed(error)))
          .finally(() => this.running.delete(run));
        this.running.add(run);
      }
      if (jobs.length === 0 && !this.stopping) await this.idle();
    }
  }

  /** Waits the polling interval, or less when stop() is called. */
  private idle(): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, this.deps.pollingIntervalMs);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.wake = done;
    });
  }

  private async run(job: PgBossJob): Promise<void> {
    const { boss, runner, metrics } = this.deps;
    const { queue, spec, sourceFromEvent, call } = this.worker;
    const attempt = job.retryCount + 1;
    const lastAttempt = job.retryCount >= job.retryLimit;
    const payload = readHandoffPayload(job.data);
    if (!payload) {
      await this.fail(job, '', attempt, lastAttempt, new Error(jobNotHandedOff(queue, job.id)));
      return;
    }
    const { event } = payload;
    // Claimed by the job's own key, not the event's: one delivery may enqueue several jobs, and
    // deliveries of other scopes (or a client's request-mode key) may share the event's key.
    const key = jobKeyOf(payload, job.id);
    const handoffJob: HandoffJob = { id: job.id, key, queue, data: payload.data, event, attempt };
    let completedInTransaction = false;
    let result: ClaimResult<unknown>;
    try {
      result = await runner.execute(
        sourceFromEvent ? { ...spec, source: event.source } : spec,
        key,
        async (delivery) => {
          const value = await call(handoffJob);
          // Transaction mode: the job's completion commits with the claim and the method's writes.
          if (delivery.executor) {
            await boss.complete(queue, job.id, undefined, { db: delivery.executor });
            completedInTransaction = true;
          }
          return value;
        },
        // The job's origin, for its span, which continues the trace context the job carries.
        { origin: { system: 'pg-boss', destination: queue, carrier: payload.trace } },
      );
    } catch (error) {
      await this.fail(job, key, attempt, lastAttempt, error, event.key);
      return;
    }
    switch (result.kind) {
      case 'processed':
        // External mode: completed after the lease is marked done, so a crash in between leaves
        // a job that expires, is handed out again and is answered by its done claim.
        if (!completedInTransaction) await this.complete(job);
        metrics.count('completed', queue);
        return;
      case 'replayed':
        await this.complete(job);
        metrics.count('replayed', queue);
        // Not silent: a job completed without running says so, and why.
        this.deps.logger.log(jobReplayed(queue, job.id, key, spec.scope));
        return;
      case 'in_flight':
        await this.fail(job, key, attempt, lastAttempt, new Error(jobInFlight(queue, key)), event.key);
        return;
    }
  }

  private async complete(job: PgBossJob): Promise<void> {
    try {
      await this.deps.boss.complete(this.worker.queue, job.id);
    } catch (error) {
      this.deps.logger.error(jobSettleFailed(this.worker.queue, job.id, 'completed', error));
    }
  }

  private async fail(
    job: PgBossJob,
    key: string,
    attempt: number,
    lastAttempt: boolean,
    error: unknown,
    eventKey?: string,
  ): Promise<void> {
    const { boss, metrics, logger } = this.deps;
    const { queue } = this.worker;
    const message = error instanceof Error ? error.message : String(error);
    metrics.count('failed', queue);
    metrics.count(lastAttempt ? 'dead_lettered' : 'retried', queue);
    const which = key ? `key ${key}${eventKey === undefined ? '' : `, event ${eventKey}`}` : 'no key';
    const log = jobFailed(queue, job.id, which, attempt, !lastAttempt, error);
    if (lastAttempt) logger.error(log);
    else logger.warn(log);
    try {
      // pg-boss keeps this as the job's output, and copies it to the dead-letter job.
      await boss.fail(queue, job.id, { message, key, attempt });
    } catch (failError) {
      logger.error(jobSettleFailed(queue, job.id, 'failed', failError));
    }
  }
}
