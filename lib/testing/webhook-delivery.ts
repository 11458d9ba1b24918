import type { EntityManager } from 'typeorm';
import { ClaimDelivery } from '../core/claim-delivery.js';
import type { ClaimHandle } from '../core/claim-strategy.js';
import { runInIdempotencyContext } from '../core/idempotency-context.js';

/** A delivery as `@IdempotentWebhook` would hand it to its handler, for tests. */
export interface WebhookDelivery {
  /** The event's key. */
  key: string;
  /** What `IdempotencyContext.manager` returns: in a test, usually a manager of the test's own transaction. */
  manager: EntityManager;
  /** The claim's scope. @default 'test' */
  scope?: string;
  /** External mode's fencing token; setting it makes the delivery external. @default undefined (transaction mode) */
  leaseToken?: string;
  /** External mode only (with `leaseToken`): which claim of the event this is. @default 1 */
  attempt?: number;
  /** External mode only (with `leaseToken`): what `IdempotencyContext.extendLease()` does. @default resolves true (the lease is held) */
  extendLease?: (ms?: number) => Promise<boolean>;
  /** What `IdempotencyContext.stale` says: a stale event run by an ordering guard with `runStale`. @default false */
  stale?: boolean;
}

/**
 * Runs `fn` as the handler of `delivery`: every service it calls that reads `IdempotencyContext`
 * (the manager, the key, the lease) sees `delivery`, so those services can be unit tested without
 * an HTTP request or a claim. No claim row is written and nothing is committed here: `manager` is
 * used as given, and its transaction is the test's to commit or roll back.
 *
 * ```ts
 * await dataSource.transaction((manager) =>
 *   runAsWebhookDelivery({ key: 'evt_1', manager }, () => payments.record(event)),
 * );
 * ```
 */
export function runAsWebhookDelivery<T>(delivery: WebhookDelivery, fn: () => T): T {
  const scope = delivery.scope ?? 'test';
  const external = delivery.leaseToken !== undefined;
  if (!external && (delivery.attempt !== undefined || delivery.extendLease !== undefined)) {
    // Silently dropping them would leave the test wondering why extendLease() throws.
    throw new TypeError(
      'runAsWebhookDelivery: attempt and extendLease belong to external mode; set leaseToken too',
    );
  }
  const afterCommit: (() => unknown)[] = [];
  const handle: ClaimHandle = {
    manager: external ? undefined : delivery.manager,
    leaseToken: delivery.leaseToken,
    attempt: external ? (delivery.attempt ?? 1) : undefined,
    extendLease: external ? (delivery.extendLease ?? (() => Promise.resolve(true))) : undefined,
    signal: new AbortController().signal,
    stale: delivery.stale ?? false,
    // Nothing is committed here: the test's own transaction decides, so callbacks are only kept.
    afterCommit: (fn) => void afterCommit.push(fn),
  };
  const spec = {
    scope,
    source: scope,
    mode: external ? 'external' : 'transaction',
    propagation: 'required',
  } as const;
  return runInIdempotencyContext(new ClaimDelivery(spec, delivery.key, handle), fn);
}
