import type { Propagation } from '../core/propagation.js';
import type { EventOrderOptions } from './event-order-options.interface.js';
import type { IdempotencyMode } from '../strategies/claim-strategies.js';

/**
 * Extracts the event's identity from a delivery: over HTTP `(body, request)`, Stripe's `evt_...`
 * (`body.id`) or GitHub's `X-GitHub-Delivery` header; over a microservice transport
 * `(data, context)`. Never a timestamp, a per-request UUID or the id of the object inside the
 * payload (one charge produces several events).
 */
export type IdempotencyKeyExtractor = (body: any, request: any) => unknown;

/** How a handler claims its events; shared by `@IdempotentWebhook`, `@Idempotent` and `IdempotencyService.run`. */
export interface IdempotencyClaimOptions {
  /**
   * Claims are unique per (scope, key): one event delivered to two handlers is processed once by each.
   * @default 'Class.method' (required by `IdempotencyService.run`)
   */
  scope?: string;
  /**
   * Stored with the claim for reporting (e.g. 'stripe').
   * @default the scope
   */
  source?: string;
  /**
   * `'transaction'`: the claim and the handler's writes through `IdempotencyContext.manager`
   * commit in one transaction. `'external'`: a fenced lease, for work outside the database
   * (email, charge, API call).
   * @default 'transaction'
   */
  mode?: IdempotencyMode;
  /**
   * Alias of `mode: 'external'`.
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
  /**
   * What this claim does when it is made while another delivery runs (a handler calling
   * `IdempotencyService.run()` or an `@Idempotent` method): `'required'` joins an enclosing
   * transaction-mode delivery's transaction in a savepoint (both commit together or not at all),
   * `'requiresNew'` claims on its own connection and commits on its own, `'mandatory'` must join
   * one, `'never'` refuses to run inside one. See `Propagation`.
   * @default 'required'
   */
  propagation?: Propagation;
}

/**
 * Options of `@IdempotentWebhook()`, for HTTP routes and microservice handlers. Evaluated at
 * import time, so they cannot come from forRootAsync.
 */
export interface IdempotentWebhookOptions extends IdempotencyClaimOptions {
  /**
   * Returns the event's identity. Throwing, or returning a non-string, empty or too long value,
   * answers 400 over HTTP (an RpcException over microservices) and writes nothing.
   */
  key: IdempotencyKeyExtractor;
  /**
   * Verify the sender's signature before the claim, with the library's guard for it (the same as
   * `@UseGuards(StripeSignatureGuard)`, ...): a forged, stale or unsigned delivery is refused
   * (400/401) and writes nothing. Its secret comes from the module's `signatures` option. HTTP
   * routes only: meaningless on an `@EventPattern` / `@MessagePattern` handler (a broker message
   * carries no sender signature), where the boot fails.
   * @default undefined (no signature check)
   */
  signature?: WebhookSignatureName;
  /**
   * The ordering guard: the newest event of each entity wins, whatever order the sender delivers
   * in. An event older than the version its entity has is stale: its claim is recorded done, the
   * handler does not run, and it is answered 200 with `Idempotent-Stale: true`. Presets:
   * `stripeEventOrder()`, `shopifyWebhookOrder()`, `standardWebhookOrder(entity)`. Transaction
   * mode only (docs/ordering.md).
   * @default undefined (no ordering: every new event runs)
   */
  order?: EventOrderOptions;
}

/** The senders `@IdempotentWebhook({ signature })` can verify. */
export type WebhookSignatureName = 'stripe' | 'github' | 'standard-webhooks' | 'shopify';

/**
 * Options of `@Idempotent()`, for provider methods no interceptor reaches: queue consumers
 * (`WorkerHost.process(job)`), cron jobs, any service method. Evaluated at import time.
 */
export interface IdempotentOptions<Args extends any[] = any[]> extends IdempotencyClaimOptions {
  /** Returns the event's identity from the method's arguments, e.g. `(job) => job.data.eventId`. */
  key: (...args: Args) => unknown;
  /**
   * What a call for an event already done resolves with (the method does not run), from the same
   * arguments and `this`: how a caller tells a replay from a result, e.g. `() => 'replayed'`.
   * @default undefined (a replay resolves undefined)
   */
  onReplay?: (...args: Args) => unknown;
}

/** Options of `IdempotencyService.run()`. */
export interface IdempotentRunOptions extends IdempotencyClaimOptions {
  /** Claims are unique per (scope, key); required here, as there is no method to name it after. */
  scope: string;
  /** The event's identity, checked with the same rules as every transport. */
  key: unknown;
}
