/**
 * Reads one thing about a delivery for the ordering guard, from the same arguments as the key
 * extractor: over HTTP `(body, request)`, over a microservice transport `(data, context)`.
 * @typeParam Body - the delivery's body (the handler's event); `any` by default
 * @typeParam Request - the HTTP request (or the microservice context); `any` by default
 */
export type EventOrderExtractor<Body = any, Request = any> = (body: Body, request: Request) => unknown;

/**
 * The ordering guard of a handler (`@IdempotentWebhook({ order })`): per (guard scope, entity) the
 * library keeps the newest version applied, and an event older than that is stale. A stale event's
 * claim is recorded done, its handler does not run (unless `runStale`), and it is answered 200 with
 * `Idempotent-Stale: true`. The version check and its advance are part of the claim's transaction:
 * a rollback advances nothing, and two events of one entity delivered at once are serialised.
 * Transaction mode only. See docs/ordering.md.
 * @typeParam Event - the body `entity` and `version` read (the handler's event); `any` by default
 * @typeParam Request - the request (or microservice context) they read; `any` by default
 */
export interface EventOrderOptions<Event = any, Request = any> {
  /**
   * The object the event is about, e.g. `(event) => event.data.object.id`: a non-empty string (a
   * whole number is taken as its decimal string). `null` leaves this event unordered (the claim
   * alone guards it): for event types the handler does not apply, which must not advance the
   * version. Anything else, or a throw, answers 400 and writes nothing.
   */
  entity: EventOrderExtractor<Event, Request>;
  /**
   * What orders the entity's events, e.g. `(event) => event.created`: a finite number, a bigint, a
   * decimal string (`'1718000000.123456'`, compared exactly, any precision) or a Date (its epoch
   * milliseconds). Must grow with every change of the entity and stay the same on a retry of one
   * event. Anything else, or a throw, answers 400 and writes nothing.
   */
  version: EventOrderExtractor<Event, Request>;
  /**
   * Versions are kept per (scope, entity). Give two handlers that apply the same objects one
   * scope, so that each sees the other's versions.
   * @default the handler's claim scope
   */
  scope?: string;
  /**
   * An event whose version equals the one applied: `'apply'` runs it (the later delivery wins, as
   * without the guard), `'stale'` treats it as stale. With a version of coarse resolution (Stripe's
   * `created` is in whole seconds) two real changes can share one, and `'stale'` would drop the
   * second; pick `'stale'` only for a version that changes with every change of the object.
   * @default 'apply'
   */
  equalVersions?: 'apply' | 'stale';
  /**
   * Run the handler for a stale event too, with `IdempotencyContext.stale === true` (to record it,
   * or apply the fields that do not go stale). The answer is still marked `Idempotent-Stale: true`.
   * @default false
   */
  runStale?: boolean;
}
