import type { Propagation } from '../core/propagation.js';
import type { EventOrderOptions } from './event-order-options.interface.js';
import type { IdempotencyMode } from '../strategies/claim-strategies.js';

/**
 * Extracts the event's identity from a delivery: over HTTP `(body, request)`, Stripe's `evt_...`
 * (`body.id`) or GitHub's `X-GitHub-Delivery` header; over a microservice transport
 * `(data, context)`. Never a timestamp, a per-request UUID or the id of the object inside the
 * payload (one charge produces several events).
 * @typeParam Body - the delivery's body (the handler's event); `any` by default
 * @typeParam Request - the HTTP request (or the microservice context); `any` by default
 */
export type IdempotencyKeyExtractor<Body = any, Request = any> = (body: Body, request: Request) => unknown;

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
 * @typeParam Event - the body `key`, `fingerprint` and `order` read (the handler's event); `any` by default
 * @typeParam Request - the request (or microservice context) they read; `any` by default
 */
export interface IdempotentWebhookOptions<Event = any, Request = any> extends IdempotencyClaimOptions {
  /**
   * Returns the event's identity. Throwing, or returning a non-string, empty or too long value,
   * answers 400 over HTTP (an RpcException over microservices) and writes nothing.
   */
  key: IdempotencyKeyExtractor<Event, Request>;
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
   * What a delivery's fingerprint is made of, stored with its claim: a delivery under a key already
   * claimed with another fingerprint is a key reused for another event (a key taken from the
   * object id: one charge has several events), reported as `key_conflict`; the same fingerprint
   * under a second key is a key that changes between copies of one event (`key_unstable`, see
   * the module's `detectUnstableKeys`). A sender preset leaves out what that sender changes
   * between copies: `'stripe'` hashes the event's id, type and created (only `pending_webhooks`
   * changes between copies, and the rest is never walked); `'github'`,
   * `'shopify'`, `'standard-webhooks'` and `'body'` the body as delivered (their delivery
   * headers are not part of it). A function's value (a string, bytes or JSON) is hashed instead;
   * `false` stores none and checks nothing. One that cannot be made (a function that throws) is
   * none for that delivery, which runs as it would without the checks.
   * @default the `signature` sender's preset, `'stripe'` with `stripeEventKey`, else `'body'`
   */
  fingerprint?: WebhookFingerprint<Event, Request>;
  /**
   * What a delivery whose fingerprint differs from its claim's gets. `'replay'`: what it would get
   * without the check (replayed when the claim is done; run when it failed; 409 in flight), with a
   * warning once per handler and the `key_conflict` count: a sender cannot fix its keys, and the
   * event it sent is the one it meant. `'refuse'`: 422 (`IdempotencyKeyReusedError`), nothing runs.
   * @default 'replay'
   */
  onKeyConflict?: 'replay' | 'refuse';
  /**
   * The ordering guard: the newest event of each entity wins, whatever order the sender delivers
   * in. An event older than the version its entity has is stale: its claim is recorded done, the
   * handler does not run, and it is answered 200 with `Idempotent-Stale: true`. Presets:
   * `stripeEventOrder()`, `shopifyWebhookOrder()`, `standardWebhookOrder(entity)`. Transaction
   * mode only (docs/ordering.md).
   * @default undefined (no ordering: every new event runs)
   */
  order?: EventOrderOptions<Event, Request>;
}

/**
 * What a webhook's fingerprint is made of (see `IdempotentWebhookOptions.fingerprint`).
 * @typeParam Event - the body a function reads; `any` by default
 * @typeParam Request - the request (or microservice context) a function reads; `any` by default
 */
export type WebhookFingerprint<Event = any, Request = any> =
  | 'stripe'
  | 'github'
  | 'shopify'
  | 'standard-webhooks'
  | 'body'
  | false
  | ((body: Event, request: Request) => unknown);

/**
 * Options of `@IdempotentRequest()`: a route of your own API whose clients send an
 * `Idempotency-Key` header (the IETF httpapi draft). Evaluated at import time.
 * @typeParam Request - the request `owner` and `fingerprint` read (e.g. one your auth guard has
 * put `user` on); `any` by default
 */
export interface IdempotentRequestOptions<Request = any> extends IdempotencyClaimOptions {
  /**
   * A request without the header is refused 400 (problem details) and runs nothing; `false` runs
   * it without a claim, as a route without the decorator would.
   * @default true
   */
  required?: boolean;
  /**
   * Whose keys they are, required: a function of the request returning the caller's identity (a
   * user, a tenant, an API key's id), made part of the claim's key, so that one caller's key never
   * replays another caller's response; or `false`, the explicit way to share keys between every
   * caller of the route (a route whose callers cannot be told apart, or need not be). Without it
   * the decorator throws at import. The function must return a non-empty string (or a number) of
   * any length; anything else is answered 500 (`IDEMPOTENCY_OWNER_UNKNOWN`) and runs nothing:
   * refuse unauthenticated requests in a guard. An owner of at most 255 characters stands in the
   * claim's key URI-encoded; a longer one (or one that could not be stored so) as `sha256=` and the
   * SHA-256 of its UTF-16 code units (hex). No answer the client receives names the owner.
   * Required: no default.
   */
  owner: false | ((request: Request) => unknown);
  /**
   * The key's syntax. `false`: the draft's quoted sf-string (`Idempotency-Key: "k2"`) or a bare
   * key (`Idempotency-Key: k2`, as most clients send a UUID): visible ASCII without spaces, double
   * quotes or commas, the header's whole value; `"k2"` and `k2` are the same key. `true`: the
   * draft's syntax only, a bare key refused 400.
   * @default false
   */
  strictKeySyntax?: boolean;
  /**
   * What a request's fingerprint is made of, stored with its claim: the same key with another
   * fingerprint is answered 422 and runs nothing. By default a SHA-256 of the method, the URL
   * (path and query), the media type of the Content-Type and the bytes of the body: the raw body
   * (`rawBody: true`), else a text or Buffer body as a parser left it, else the parsed body
   * serialised again. A body no parser read (a Content-Type the app has no parser for, or a route
   * that reads the stream itself) is answered 415 (`IDEMPOTENCY_BODY_UNPARSED`) and runs nothing.
   * A function's value (a string, bytes or JSON) is hashed instead, and reads what it likes;
   * `false` checks nothing.
   * @default method, URL, media type and body bytes
   */
  fingerprint?: false | ((request: Request) => unknown);
  /**
   * Response headers stored with the response and set again on its replays, as the handler set
   * them (`@Header()`, or `@Res({ passthrough: true })`), under the names it wrote. Status, body
   * and a Content-Type the handler set are always stored.
   * @default ['Location']
   */
  replayHeaders?: string[];
  /**
   * The largest body stored for replays, in bytes of its JSON, overriding the module's. Over it, in
   * transaction mode the request fails (500, `IDEMPOTENCY_RESPONSE_NOT_STORED`) and is rolled back,
   * writes and claim alike, so that no claim is ever done without its response; in external mode
   * (its work has happened) the status and headers are stored without the body, logged as an error.
   * @default the module's maxStoredResponseBytes (65536)
   */
  maxStoredResponseBytes?: number;
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
