import { Inject, Injectable } from '@nestjs/common';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import { describeError } from '../idempotency.messages.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { HandoffQueues } from '../transports/queue/handoff-queues.service.js';

/** Thresholds of `IdempotencyHealthIndicator.isHealthy()`: over one, the indicator is down. */
export interface IdempotencyHealthOptions {
  /**
   * Down when more claims than this are poison (not done after `maxAttempts` attempts). Leave it
   * out on a readiness probe: a poison event is an alert for a person, and taking the instance
   * out of the load balancer does not fix it.
   * @default undefined (reported, never down)
   */
  maxPoisonEvents?: number;
  /**
   * Down when more leases than this have expired (their worker probably died).
   * @default undefined (reported, never down)
   */
  maxExpiredLeases?: number;
  /**
   * Down when a handoff queue's oldest waiting job (queued or retrying) has waited longer than
   * this, in ms: the workers do not keep up.
   * @default undefined (reported, never down)
   */
  maxQueueLagMs?: number;
  /**
   * Down when the claims table has not answered within this many ms.
   * @default 1000
   */
  timeoutMs?: number;
}

/** One handoff queue as the indicator reports it. */
export interface QueueHealth {
  /** How long its oldest waiting job has waited, in ms. */
  oldestWaitingMs: number;
  /** Jobs waiting in its dead-letter queue. */
  deadLettered: number;
}

/** What the indicator reports under its key, up or down. */
export interface IdempotencyHealthDetails {
  status: 'up' | 'down';
  /** `reachable`, or `unreachable` when the claims table did not answer (then nothing else is read). */
  claimsTable: 'reachable' | 'unreachable';
  poisonEvents?: number;
  expiredLeases?: number;
  /** Each handoff queue, when the module has the `handoff` option. */
  queues?: Record<string, QueueHealth>;
  /** Down: what is over its threshold, or what failed, one sentence each. */
  problems?: string[];
}

/**
 * A @nestjs/terminus health indicator result: the details under the indicator's key. The same
 * shape as terminus's `HealthIndicatorResult`, so `HealthCheckService.check()` takes it, and the
 * library needs no import of terminus (an optional peer) at all.
 */
export type IdempotencyHealthResult<Key extends string = 'idempotency'> = Record<
  Key,
  IdempotencyHealthDetails
>;

/** The claims table took longer than `timeoutMs`. */
const timedOut = (ms: number) => `the claims table did not answer within ${ms} ms`;

/** @default 1000, the timeout of `isHealthy()`. */
const DEFAULT_TIMEOUT_MS = 1_000;

/**
 * The library's health for @nestjs/terminus: the claims table reachable, poison events and
 * expired leases, and each handoff queue's lag, against the thresholds you choose. One round trip
 * to the claims table (and one to pg-boss's job table with the `handoff` option).
 *
 * ```ts
 * @Get('health')
 * @HealthCheck()
 * check() {
 *   return this.health.check([() => this.idempotency.isHealthy('idempotency', { maxQueueLagMs: 300_000 })]);
 * }
 * ```
 */
@Injectable()
export class IdempotencyHealthIndicator {
  constructor(
    private readonly database: ClaimDatabase,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly queues: HandoffQueues,
  ) {}

  /**
   * Checks now, and answers `{ [key]: { status: 'up' | 'down', ... } }`; never throws (terminus
   * reads a returned `down` as a failed check and answers 503).
   */
  async isHealthy<const Key extends string = 'idempotency'>(
    key: Key = 'idempotency' as Key,
    options: IdempotencyHealthOptions = {},
  ): Promise<IdempotencyHealthResult<Key>> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const down = (details: Omit<IdempotencyHealthDetails, 'status'>) =>
      ({ [key]: { status: 'down', ...details } }) as IdempotencyHealthResult<Key>;
    let counts: { poison: number; expired: number };
    let queues: Record<string, QueueHealth> | undefined;
    try {
      [counts, queues] = await withTimeout(Promise.all([this.counts(), this.queueHealth()]), timeoutMs);
    } catch (error) {
      return down({ claimsTable: 'unreachable', problems: [describeError(error)] });
    }
    const details: Omit<IdempotencyHealthDetails, 'status'> = {
      claimsTable: 'reachable',
      poisonEvents: counts.poison,
      expiredLeases: counts.expired,
      ...(queues ? { queues } : {}),
    };
    const problems: string[] = [];
    const over = (value: number, limit: number | undefined) => limit !== undefined && value > limit;
    if (over(counts.poison, options.maxPoisonEvents)) {
      problems.push(`${counts.poison} poison events (more than ${options.maxPoisonEvents})`);
    }
    if (over(counts.expired, options.maxExpiredLeases)) {
      problems.push(`${counts.expired} expired leases (more than ${options.maxExpiredLeases})`);
    }
    for (const [name, queue] of Object.entries(queues ?? {})) {
      if (over(queue.oldestWaitingMs, options.maxQueueLagMs)) {
        problems.push(
          `queue ${name}: its oldest job has waited ${queue.oldestWaitingMs} ms (more than ${options.maxQueueLagMs})`,
        );
      }
    }
    if (problems.length > 0) return down({ ...details, problems });
    return { [key]: { status: 'up', ...details } } as IdempotencyHealthResult<Key>;
  }

  private async counts(): Promise<{ poison: number; expired: number }> {
    const [row] = await this.database.dataSource.query(this.database.maintenance.healthCounts, [
      this.config.maxAttempts,
    ]);
    return { poison: Number(row?.poison ?? 0), expired: Number(row?.expired ?? 0) };
  }

  /** Each queue's lag and dead letters; undefined without the `handoff` option. */
  private async queueHealth(): Promise<Record<string, QueueHealth> | undefined> {
    const stats = await this.queues.stats();
    const names = Object.keys(stats);
    if (names.length === 0) return undefined;
    return Object.fromEntries(
      names.map((name) => [
        name,
        { oldestWaitingMs: stats[name]!.oldestWaitingMs, deadLettered: stats[name]!.deadLettered },
      ]),
    );
  }
}

/** `work`, or a rejection once `ms` have passed (the query goes on; its answer is dropped). */
function withTimeout<T>(work: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(timedOut(ms))), ms);
    timer.unref();
  });
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}
