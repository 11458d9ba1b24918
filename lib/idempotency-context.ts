import { AsyncLocalStorage } from 'node:async_hooks';
import { Injectable } from '@nestjs/common';
import type { EntityManager } from 'typeorm';

/** What a decorated handler runs with; one per delivery. */
export interface IdempotencyStore {
  key: string;
  scope: string;
  source: string;
  external: boolean;
  /** Transaction mode: the claim's transaction. External mode: the DataSource's manager. */
  manager: EntityManager;
  leaseToken?: string;
  attempt?: number;
  extendLease?: (ms?: number) => Promise<boolean>;
}

/** One store per process: the interceptor writes it, handlers and their services read it. */
const storage = new AsyncLocalStorage<IdempotencyStore>();

/** The current delivery's store, or undefined outside a decorated handler. */
export function currentIdempotencyStore(): IdempotencyStore | undefined {
  return storage.getStore();
}

/** Runs `fn` with `store` as the current delivery's context. */
export function runInIdempotencyContext<T>(store: IdempotencyStore, fn: () => T): T {
  return storage.run(store, fn);
}

/**
 * The current delivery, from anywhere the decorated handler calls (services, repositories),
 * through AsyncLocalStorage. Outside a decorated handler every getter throws, so a missing
 * decorator is found at once rather than writing outside the claim's transaction.
 */
@Injectable()
export class IdempotencyContext {
  /** True inside a handler decorated with `@IdempotentWebhook`. */
  get active(): boolean {
    return storage.getStore() !== undefined;
  }

  /** Transaction mode: the EntityManager of the claim's transaction; write through it. */
  get manager(): EntityManager {
    return this.store.manager;
  }

  /** The event's key. */
  get key(): string {
    return this.store.key;
  }

  /** The claim's scope (default `ControllerClass.method`). */
  get scope(): string {
    return this.store.scope;
  }

  /** External mode: this claim's fencing token. */
  get leaseToken(): string | undefined {
    return this.store.leaseToken;
  }

  /** External mode: 1 for the first claim, then +1 for each re-claim. */
  get attempt(): number | undefined {
    return this.store.attempt;
  }

  /**
   * External mode: pushes the lease's expiry to now + `ms` (default: the handler's lease).
   * Resolves false when the lease was lost to another worker: stop, your work may run twice.
   */
  extendLease(ms?: number): Promise<boolean> {
    const extend = this.store.extendLease;
    if (!extend) throw new Error('extendLease() is only available in external mode handlers');
    return extend(ms);
  }

  private get store(): IdempotencyStore {
    const store = storage.getStore();
    if (!store) throw new Error('IdempotencyContext used outside an @IdempotentWebhook handler');
    return store;
  }
}
