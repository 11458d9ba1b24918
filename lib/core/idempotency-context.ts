import { AsyncLocalStorage } from 'node:async_hooks';
import { Inject, Injectable, Optional } from '@nestjs/common';
import type { EntityManager } from 'typeorm';
import { handoffNotConfigured } from '../idempotency.messages.js';
import type { EnqueueOptions } from '../interfaces/index.js';
import type { IdempotentDelivery } from './claim-delivery.js';
import { downstreamKeyOf } from './downstream-key.js';
import { processWide } from './process-wide.js';
import { JOB_ENQUEUER, type JobEnqueuer } from './job-enqueuer.js';

const outsideContext = () =>
  'IdempotencyContext used outside an idempotent handler (@IdempotentWebhook, @Idempotent or IdempotencyService.run)';

const notExternal = (what: string) => `${what} is only available in external mode handlers`;

export type { IdempotentDelivery } from './claim-delivery.js';

/**
 * One store per process, shared by the ESM and CommonJS builds (see processWide): the service
 * writes it, handlers and their services read it.
 */
const storage = processWide('delivery-context', () => new AsyncLocalStorage<IdempotentDelivery>());

/** The current delivery, or undefined outside an idempotent handler. */
export function currentDelivery(): IdempotentDelivery | undefined {
  return storage.getStore();
}

/** Runs `fn` with `delivery` as the current delivery. */
export function runInIdempotencyContext<T>(delivery: IdempotentDelivery, fn: () => T): T {
  return storage.run(delivery, fn);
}

/**
 * The current delivery, from anywhere an idempotent handler calls (services, repositories),
 * through AsyncLocalStorage: inside `@IdempotentWebhook` handlers, `@Idempotent` methods and
 * `IdempotencyService.run()` callbacks. Outside them every getter throws, so a missing decorator
 * is found at once rather than writing outside the claim's transaction.
 */
@Injectable()
export class IdempotencyContext {
  constructor(@Optional() @Inject(JOB_ENQUEUER) private readonly enqueuer?: JobEnqueuer) {}

  /** True inside an idempotent handler. */
  get active(): boolean {
    return storage.getStore() !== undefined;
  }

  /**
   * Transaction mode: the EntityManager of the claim's transaction; write through it, and the
   * writes commit with the claim or not at all. External mode holds no claim transaction: this
   * throws, naming the handler (write through your own repository there).
   */
  get manager(): EntityManager {
    return this.delivery.manager;
  }

  /**
   * Aborts when the delivery no longer holds its claim: in external mode, when its lease is taken
   * over or runs out (stop: another worker may be running the event). Never aborts in
   * transaction mode. Hand it to `fetch()` and other abortable work.
   */
  get signal(): AbortSignal {
    return this.delivery.signal;
  }

  /**
   * Runs `fn` once the claim is recorded done (after the COMMIT, or external mode's fenced
   * completion), never when the delivery fails or rolls back: for cache busts and notifications.
   * Registered inside a transaction the handler opened on the claim's manager
   * (`manager.transaction()`, nestjs-cls's `@Transactional(Propagation.Nested)`,
   * `queryRunner.startTransaction()`: savepoints), it goes with that transaction: never run if it
   * rolls back, even when the handler catches the error and the delivery commits. `SAVEPOINT` and
   * `ROLLBACK TO` sent by hand through `manager.query()` are not followed. Callbacks run in order
   * before the answer is sent; an error in one is logged and changes nothing.
   */
  afterCommit(fn: () => unknown): void {
    this.delivery.afterCommit(fn);
  }

  /**
   * True when the handler's ordering guard found this event older than the version its entity
   * already has: the handler runs for such an event only with `order: { runStale: true }`. Apply
   * nothing the newer event set (record it, or apply what does not go stale). Always false for a
   * handler without the guard.
   */
  get stale(): boolean {
    return this.delivery.stale;
  }

  /**
   * The delivery's key: the event's (Stripe's `evt_...`), a request-mode route's (with its owner),
   * or, in an `@IdempotentWorker`, the job's (`HandoffJob.key`). To send it downstream, send
   * `downstreamKey`: this may hold characters no header can carry.
   */
  get key(): string {
    return this.delivery.key;
  }

  /**
   * The delivery's key in a form any HTTP header value can carry, the same on every attempt: for
   * the `Idempotency-Key` of a call downstream, so that the API there can tell a retry from a new
   * call. It is `key` itself when that is visible ASCII of at most 255 characters (every Stripe,
   * GitHub or UUID key), else `sha256-` and the base64url SHA-256 of its UTF-8 bytes (50
   * characters), also for a key that starts with `sha256-`. In a worker it is the job's key's form.
   *
   * ```ts
   * await fetch(url, { method: 'POST', headers: { 'idempotency-key': this.context.downstreamKey }, body });
   * ```
   */
  get downstreamKey(): string {
    return downstreamKeyOf(this.delivery.key);
  }

  /** The claim's scope (default `Class.method`). */
  get scope(): string {
    return this.delivery.scope;
  }

  /** External mode: this claim's fencing token. */
  get leaseToken(): string | undefined {
    return this.delivery.leaseToken;
  }

  /** External mode: 1 for the first claim, then +1 for each re-claim. */
  get attempt(): number | undefined {
    return this.delivery.attempt;
  }

  /**
   * External mode: pushes the lease's expiry to now + `ms` (default: the handler's lease).
   * Resolves false when the lease was lost to another worker: stop, your work may run twice.
   */
  extendLease(ms?: number): Promise<boolean> {
    const extend = this.delivery.extendLease;
    if (!extend) throw new Error(notExternal('extendLease()'));
    return extend(ms);
  }

  /**
   * Transaction mode: hands the event to a worker. Writes a pg-boss job on `queue` in the claim's
   * own transaction (sent with its COMMIT, in the same round trip), so the claim, the handler's
   * writes and the job commit together or not at all, and the delivery is acknowledged after that
   * one COMMIT. The job carries this
   * delivery's key, scope and source; an `@IdempotentWorker` on `queue` runs it under a claim of
   * its own, keyed by the job: every job enqueued runs (one per line item, say), each once however
   * often pg-boss hands it out. `options.key` gives the job a key of your own instead of its id:
   * jobs with the same key run once on their worker, across deliveries. Enqueued inside a
   * transaction the handler opened on the claim's manager (a savepoint: `manager.transaction()`,
   * nestjs-cls's `Propagation.Nested`) or a claim joined in one, the job goes with it: not written
   * if it rolls back, even when the handler catches the error (`SAVEPOINT`/`ROLLBACK TO` sent by
   * hand through `manager.query()` are not followed). Resolves with the job's id (a job rolled back
   * with its savepoint keeps the id it was given and is never written); rejects (failing the
   * delivery, which rolls back) when the queue does not exist, the module has no `handoff` option,
   * or `options.key` is not a usable key (`InvalidIdempotencyKeyError`, 400).
   *
   * ```ts
   * await this.context.enqueue('fulfilment', { sessionId: session.id });
   * // Once per order, however many events ask for it:
   * await this.context.enqueue('shipping', { orderId }, { key: `ship:${orderId}` });
   * ```
   */
  enqueue<T>(queue: string, data: T, options?: EnqueueOptions): Promise<string> {
    let delivery: IdempotentDelivery;
    try {
      delivery = this.delivery;
    } catch (error) {
      return Promise.reject(error);
    }
    if (!this.enqueuer)
      return Promise.reject(new Error(handoffNotConfigured('IdempotencyContext.enqueue()')));
    return this.enqueuer.enqueue(delivery, queue, data, options);
  }

  private get delivery(): IdempotentDelivery {
    const delivery = storage.getStore();
    if (!delivery) throw new Error(outsideContext());
    return delivery;
  }
}
