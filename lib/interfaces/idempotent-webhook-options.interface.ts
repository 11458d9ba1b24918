/**
 * Extracts the event's identity from a delivery: Stripe's `evt_...` (`body.id`), GitHub's
 * `X-GitHub-Delivery` header. Never a timestamp, a per-request UUID or the id of the object inside
 * the payload (one charge produces several events).
 */
export type IdempotencyKeyExtractor = (body: any, request: any) => unknown;

/** Options of `@IdempotentWebhook()`. Evaluated at import time, so they cannot come from forRootAsync. */
export interface IdempotentWebhookOptions {
  /** Returns the event's identity. Throwing, or returning a non-string, empty or too long value, answers 400. */
  key: IdempotencyKeyExtractor;
  /**
   * Claims are unique per (scope, key): one event delivered to two handlers is processed once by each.
   * @default 'ControllerClass.method'
   */
  scope?: string;
  /**
   * Stored with the claim for reporting (e.g. 'stripe').
   * @default the scope
   */
  source?: string;
  /**
   * External mode: a lease claim for work outside the database (email, charge, API call) instead of
   * one transaction around claim and handler.
   * @default false
   */
  external?: boolean;
  /**
   * External mode: this handler's lease, overriding the module's `leaseMs`.
   * @default the module's leaseMs (300000)
   */
  leaseMs?: number;
  /**
   * External mode: renew the lease every leaseMs/3 while the handler runs.
   * @default false
   */
  heartbeat?: boolean;
}

/** What the decorator stores: the options with scope and source resolved. */
export interface IdempotentWebhookMetadata extends IdempotentWebhookOptions {
  scope: string;
  source: string;
  external: boolean;
}
