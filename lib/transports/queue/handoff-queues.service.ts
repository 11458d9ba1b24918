import { Injectable, Logger } from '@nestjs/common';
import type { DeadLetteredJob, QueueStats, RetryDeadLetterResult } from '../../interfaces/index.js';
import { retryDeadLetter } from './dead-letter-retry.js';
import { HandoffMetrics } from './handoff-metrics.js';
import { readHandoffPayload } from './handoff-payload.js';
import { QueueHandoff } from './queue-handoff.js';

const deadLetteredJob = (queue: string, deadLetter: string, key: string, lastError: string | null) =>
  `dead-lettered job: queue ${queue} event ${key} ran out of retries and waits in ${deadLetter}${lastError ? `; last error: ${lastError}` : ''}`;

const moreDeadLetteredJobs = (count: number) => `... and ${count} more dead-lettered jobs`;

const deadLetterRetried = (queue: string, id: string, jobId: string, key: string | undefined) =>
  `dead-lettered job ${id} retried by an operator: event ${key ?? '(none)'} is queued again in ${queue} as job ${jobId}`;

/** Dead-lettered jobs logged per report; the rest is counted in one line. */
const MAX_LOGGED_DEAD_LETTERS = 50;
/** Dead-lettered jobs a report returns. */
const MAX_REPORTED_DEAD_LETTERS = 100;

/**
 * The handoff's queues as operators see them: each queue's jobs by state and its oldest waiting
 * job's age (`stats()`, also kept in HandoffMetrics), and the jobs waiting in dead-letter queues,
 * which the expired-lease reporter logs every report until someone deals with them. Empty
 * without the module's `handoff` option.
 *
 * ```ts
 * const { fulfilment } = await app.get(HandoffQueues).stats();
 * // { queued: 3, retrying: 0, active: 1, failed: 0, deadLettered: 0, oldestWaitingMs: 120 }
 * ```
 */
@Injectable()
export class HandoffQueues {
  private readonly logger = new Logger('IdempotencyHandoff');

  constructor(
    private readonly handoff: QueueHandoff,
    private readonly metrics: HandoffMetrics,
  ) {}

  /**
   * Each queue created at boot, as the database has it now (jobs by state, its dead-letter
   * queue's waiting jobs, the oldest waiting job's age), also recorded in HandoffMetrics.
   */
  async stats(): Promise<Record<string, QueueStats>> {
    if (!this.handoff.statements) return {};
    const names = [...this.handoff.queues.keys()];
    const deadLetters = [...this.handoff.queues.values()].map((settings) => settings.deadLetter);
    const { rows } = await this.handoff.db.executeSql(this.handoff.statements.stats, [
      [...new Set([...names, ...deadLetters])],
    ]);
    const byName = new Map(rows.map((row) => [row.name as string, row]));
    const result: Record<string, QueueStats> = {};
    for (const [name, settings] of this.handoff.queues) {
      const row = byName.get(name);
      const dead = byName.get(settings.deadLetter);
      const stats: QueueStats = {
        queued: Number(row?.queued ?? 0),
        retrying: Number(row?.retrying ?? 0),
        active: Number(row?.active ?? 0),
        failed: Number(row?.failed ?? 0),
        deadLettered: Number(dead?.queued ?? 0) + Number(dead?.retrying ?? 0),
        oldestWaitingMs: Math.round(Number(row?.oldest_waiting_ms ?? 0)),
      };
      this.metrics.setQueueStats(name, stats);
      result[name] = stats;
    }
    return result;
  }

  /**
   * The expired-lease reporter's part for the handoff: refreshes the queue figures and, when
   * `log`, logs the jobs waiting in dead-letter queues (as poison events are, every report, until
   * someone deals with them). Resolves with those jobs, at most 100.
   */
  async report(log: boolean): Promise<DeadLetteredJob[]> {
    if (!this.handoff.statements) return [];
    await this.stats();
    if (!log) return [];
    const jobs = await this.deadLetters(MAX_REPORTED_DEAD_LETTERS);
    for (const job of jobs.slice(0, MAX_LOGGED_DEAD_LETTERS)) {
      this.logger.error(deadLetteredJob(job.queue, job.deadLetter, job.event?.key ?? job.id, job.lastError));
    }
    if (jobs.length > MAX_LOGGED_DEAD_LETTERS) {
      this.logger.error(moreDeadLetteredJobs(jobs.length - MAX_LOGGED_DEAD_LETTERS));
    }
    return jobs;
  }

  /**
   * The jobs waiting in the handoff's dead-letter queues, oldest first, at most `limit` (100), with
   * their event and last error; empty without the `handoff` option.
   */
  async deadLetters(limit = MAX_REPORTED_DEAD_LETTERS): Promise<DeadLetteredJob[]> {
    if (!this.handoff.statements) return [];
    const queuesOf = new Map<string, string[]>();
    for (const [name, settings] of this.handoff.queues) {
      queuesOf.set(settings.deadLetter, [...(queuesOf.get(settings.deadLetter) ?? []), name]);
    }
    const { rows } = await this.handoff.db.executeSql(this.handoff.statements.deadLettered, [
      [...queuesOf.keys()],
      limit,
    ]);
    return rows.map((row): DeadLetteredJob => {
      const payload = readHandoffPayload(row.data);
      const output = row.output as { message?: unknown } | null;
      return {
        queue: (queuesOf.get(row.name) ?? [row.name]).join(', '),
        deadLetter: row.name,
        id: row.id,
        event: payload?.event ?? null,
        data: payload ? payload.data : row.data,
        lastError: typeof output?.message === 'string' ? output.message : null,
        createdAt: new Date(row.created_on),
      };
    });
  }

  /**
   * Sends dead-lettered job `id` (its id in the dead-letter queue, as `deadLetters()` lists it)
   * back to `queue`, the queue it ran out of retries in, as a new job with the same data and the
   * queue's retries afresh. The dead-letter copy is removed in the same transaction, so a retry
   * happens once however often it is asked for. Logged as a warning. Refused (`retried: false`),
   * changing nothing: `unknown_queue`, `not_found` (retried already, or not there). Throws only
   * when the database fails or the handoff has not started.
   */
  async retryDeadLetter(queue: string, id: string): Promise<RetryDeadLetterResult> {
    const result = await retryDeadLetter(this.handoff, queue, id);
    if (result.retried) this.logger.warn(deadLetterRetried(queue, id, result.jobId, result.event?.key));
    else this.logger.log(`dead-letter retry refused: ${result.message}`);
    return result;
  }
}
