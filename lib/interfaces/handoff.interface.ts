import type { IdempotencyClaimOptions } from './idempotent-webhook-options.interface.js';

/**
 * `handoff` of the module options: acknowledge a delivery at once and process it in a worker,
 * through pg-boss (an optional peer dependency, ^10.4) on the DataSource's database. Without it
 * pg-boss is never loaded.
 */
export interface HandoffOptions {
  /**
   * Schema pg-boss keeps its tables in, created (and migrated) at boot.
   * @default 'pgboss'
   */
  schema?: string;
  /**
   * The queues this app creates at boot, with their settings (applied again at every boot). A queue
   * an `@IdempotentWorker` names is created too, with the defaults. An app that only enqueues lists
   * its queues here: a job for a queue that does not exist fails its delivery.
   * @default {}
   */
  queues?: Record<string, HandoffQueueOptions>;
  /**
   * On shutdown, how long running jobs get to finish before the app goes on closing. A job still
   * running then is left to pg-boss, which hands it out again once it expires.
   * @default 10000
   */
  drainMs?: number;
  /**
   * How often an idle worker looks for jobs, in milliseconds. A busy worker fetches again as
   * soon as a job finishes.
   * @default 2000
   */
  pollingIntervalMs?: number;
  /**
   * How often pg-boss's maintenance runs, in seconds: it fails jobs whose worker died once they
   * expire (so that they are retried) and archives finished ones. One instance runs it each time.
   * @default 60
   */
  maintenanceIntervalSeconds?: number;
}

/** One queue's settings, given to pg-boss's createQueue/updateQueue at boot. */
export interface HandoffQueueOptions {
  /**
   * Retries after the first attempt; a job that fails them all moves to the dead-letter queue.
   * @default 5
   */
  retryLimit?: number;
  /**
   * Seconds before the first retry (with `retryBackoff`, the base of an exponential backoff with
   * jitter: between 1× and 2× the delay, doubling each retry).
   * @default 10
   */
  retryDelaySeconds?: number;
  /**
   * Exponential backoff between retries.
   * @default true
   */
  retryBackoff?: boolean;
  /**
   * How long a worker may hold a job before pg-boss fails it and hands it out again: a worker that
   * died is noticed after this (plus up to `maintenanceIntervalSeconds`). For an external-mode
   * worker keep it at least its lease, or the job is handed out while the lease still holds.
   * Below 24 hours.
   * @default 900
   */
  expireInSeconds?: number;
  /**
   * The queue a job that ran out of retries moves to, created at boot. The reporter logs what
   * waits there.
   * @default '<queue>.dead-letter'
   */
  deadLetter?: string;
}

/** Options of `IdempotencyContext.enqueue()`. */
export interface EnqueueOptions {
  /**
   * Start the job no sooner than this many seconds after the delivery commits.
   * @default 0
   */
  startAfterSeconds?: number;
  /**
   * Higher runs first (pg-boss's priority).
   * @default 0
   */
  priority?: number;
  /**
   * The job's own key: what the worker claims it under (`HandoffJob.key`), so that jobs with the
   * same key on one worker run once, whichever delivery enqueued them (an order fulfilled once,
   * however many events ask for it). Checked as every key is: a bad one rejects the enqueue with
   * `InvalidIdempotencyKeyError` (the delivery fails with 400, nothing written). A job whose key
   * already ran is completed without running, counted `replayed` and logged.
   * @default the job's id: every job runs once, however often pg-boss hands it out
   */
  key?: string;
}

/** The event a job was handed off by: the delivery that enqueued it. */
export interface HandedOffEvent {
  /**
   * The enqueuing delivery's key (Stripe's `evt_...`). Not the job's: one delivery may enqueue
   * several jobs, so send `HandoffJob.key` (as `IdempotencyContext.downstreamKey`) downstream.
   */
  key: string;
  /** The scope of the delivery that enqueued it. */
  scope: string;
  /** The source of the delivery that enqueued it. */
  source: string;
}

/** What an `@IdempotentWorker` method is called with: one pg-boss job. */
export interface HandoffJob<T = unknown> {
  /** pg-boss's job id. */
  id: string;
  /**
   * The key the worker claims the job under, the same on every attempt: `enqueue()`'s `key`, else
   * the id the job was enqueued with (a dead letter moved back keeps it). What the worker is
   * `IdempotencyContext.key`; send `IdempotencyContext.downstreamKey`, its header-safe form, as the
   * Idempotency-Key of a call downstream, not `event.key` (two jobs of one event would share it).
   */
  key: string;
  queue: string;
  /** What the handler passed to `enqueue()`. */
  data: T;
  /** The event the job was enqueued for. */
  event: HandedOffEvent;
  /** pg-boss's attempt: 1, then +1 for each retry (an expired job counts as one). */
  attempt: number;
}

/** Options of `@IdempotentWorker(queue, options)`. */
export interface IdempotentWorkerOptions extends IdempotencyClaimOptions {
  /**
   * Stored with the worker's claims for reporting.
   * @default the source of the delivery that enqueued the job
   */
  source?: string;
  /**
   * Jobs this worker runs at once in this process; each running job holds a pool connection
   * (transaction mode: for its whole run).
   * @default 1
   */
  concurrency?: number;
}

/** What a worker did with a job, counted per queue (`HandoffMetrics`). */
export type JobOutcome = 'completed' | 'replayed' | 'failed' | 'retried' | 'dead_lettered';

/** A job that ran out of retries and waits in its dead-letter queue. */
export interface DeadLetteredJob {
  /** The queue it ran out of retries in. */
  queue: string;
  /** The dead-letter queue it waits in. */
  deadLetter: string;
  /** Its id in the dead-letter queue. */
  id: string;
  /** The event it was enqueued for, if it was a handoff job. */
  event: HandedOffEvent | null;
  data: unknown;
  /** The last attempt's error message. */
  lastError: string | null;
  createdAt: Date;
}

/**
 * What `HandoffQueues.retryDeadLetter()` did: the dead-lettered job was moved back to its queue
 * as a new job (`jobId`), or nothing changed, and why: `unknown_queue` (not a queue of the
 * handoff), `not_found` (no such job waiting in that queue's dead-letter queue: retried already,
 * or never there).
 */
export type RetryDeadLetterResult =
  | { retried: true; queue: string; jobId: string; event: HandedOffEvent | null }
  | { retried: false; reason: 'unknown_queue' | 'not_found'; message: string };

/** One queue's jobs as the database has them now. */
export interface QueueStats {
  /** Waiting for their first attempt (state `created`). */
  queued: number;
  /** Waiting for a retry after a failed attempt (state `retry`). */
  retrying: number;
  /** Held by a worker now. */
  active: number;
  /** Out of retries (state `failed`, until pg-boss archives them). */
  failed: number;
  /** Waiting in this queue's dead-letter queue. */
  deadLettered: number;
  /** Age of the oldest job waiting (queued or retrying), in ms; 0 when none waits. */
  oldestWaitingMs: number;
}
