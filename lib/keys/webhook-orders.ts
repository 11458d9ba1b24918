import { headerMissing } from '../idempotency.messages.js';
import type { EventOrderExtractor, EventOrderOptions } from '../interfaces/index.js';

/**
 * Ordering guard presets for the senders the library knows (`@IdempotentWebhook({ order })`, see
 * docs/ordering.md): what names the object an event is about, and what orders its events. Spread
 * one to add options: `order: { ...stripeEventOrder(), runStale: true }`.
 */

type Headers = Record<string, string | string[] | undefined>;

/** One header's value, the same on Express and Fastify (both lower-case incoming names). */
function headerValue(request: { headers?: Headers } | undefined, display: string): string {
  const value = request?.headers?.[display.toLowerCase()];
  if (value === undefined || value === '') throw new Error(headerMissing(display));
  if (typeof value !== 'string') throw new Error(`${display} header appears more than once`);
  return value;
}

/** `2024-05-01T12:00:00.123456789Z`, `2024-05-01T08:00:00-04:00`: a date, a time, a fraction, an offset. */
const ISO_TIMESTAMP = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$/;

/**
 * An ISO 8601 timestamp as seconds since the epoch, with its whole fraction (Shopify's
 * `X-Shopify-Triggered-At` has nanoseconds, which a Date would cut to milliseconds): a decimal
 * string the guard compares exactly. Throws for anything else, naming `what`.
 */
export function isoTimestampVersion(text: unknown, what = 'version'): string {
  const match = typeof text === 'string' ? ISO_TIMESTAMP.exec(text) : null;
  if (!match) throw new Error(`${what} is not an ISO 8601 timestamp: ${JSON.stringify(text)?.slice(0, 60)}`);
  const [, year, month, day, hour, minute, second, fraction, zone] = match;
  const local = Date.UTC(+year, +month - 1, +day, +hour, +minute, +second) / 1000;
  const offset =
    zone === 'Z' ? 0 : (zone[0] === '-' ? -1 : 1) * (+zone.slice(1, 3) * 3600 + +zone.slice(4, 6) * 60);
  const seconds = local - offset;
  // Before 1970 a fraction would count the wrong way: no sender's event is that old.
  if (!Number.isFinite(seconds) || seconds < 0)
    throw new Error(`${what} is not a date after 1970: ${text as string}`);
  return fraction ? `${seconds}.${fraction}` : String(seconds);
}

/** Options of stripeEventOrder(). */
export interface StripeEventOrderOptions {
  /**
   * The event types the handler applies; any other type is left unordered (it neither checks nor
   * advances the version), so an event the handler ignores cannot make a later-delivered older
   * one of a type it applies look stale.
   * @default undefined (every event is ordered)
   */
  types?: readonly string[];
}

/**
 * Stripe: the entity is the event's object (`data.object.id`, a subscription `sub_...`, an invoice
 * `in_...`), the version the event's own `created` (when Stripe made the event, the same on every
 * retry; not `data.object.created`, which is when the object was made). `created` is in whole
 * seconds: two events of one object in one second have equal versions, and are applied in the
 * order they arrive (`equalVersions: 'apply'`).
 */
export function stripeEventOrder(options: StripeEventOrderOptions = {}): EventOrderOptions {
  const types = options.types === undefined ? undefined : new Set(options.types);
  return {
    entity: (event: { type?: unknown; data?: { object?: { id?: unknown } } } | undefined) => {
      if (types && !types.has(event?.type as string)) return null;
      return event?.data?.object?.id;
    },
    version: (event: { created?: unknown } | undefined) => event?.created,
  };
}

/** Options of shopifyWebhookOrder(). */
export interface ShopifyWebhookOrderOptions {
  /**
   * `'triggered-at'`: the `X-Shopify-Triggered-At` header, when the event fired (nanoseconds, the
   * same on retries). `'updated_at'`: the payload's `updated_at`, when the resource last changed
   * (whole seconds; not in every topic's payload: a `products/delete` carries only the id).
   * @default 'triggered-at'
   */
  version?: 'triggered-at' | 'updated_at';
  /**
   * The topics (`X-Shopify-Topic`) the handler applies; any other is left unordered.
   * @default undefined (every topic is ordered)
   */
  topics?: readonly string[];
}

/**
 * Shopify: the entity is the resource's `id` in the payload (an order, a product), the version
 * `X-Shopify-Triggered-At` or the payload's `updated_at` (see ShopifyWebhookOrderOptions). A topic
 * whose payload has no `id` (`inventory_levels/update`) needs an entity of your own.
 */
export function shopifyWebhookOrder(options: ShopifyWebhookOrderOptions = {}): EventOrderOptions {
  const topics = options.topics === undefined ? undefined : new Set(options.topics);
  const fromPayload = options.version === 'updated_at';
  return {
    entity: (resource: { id?: unknown } | undefined, request: { headers?: Headers }) => {
      if (topics && !topics.has(headerValue(request, 'X-Shopify-Topic'))) return null;
      return resource?.id;
    },
    version: (resource: { updated_at?: unknown } | undefined, request: { headers?: Headers }) =>
      fromPayload
        ? isoTimestampVersion(resource?.updated_at, 'updated_at')
        : isoTimestampVersion(headerValue(request, 'X-Shopify-Triggered-At'), 'X-Shopify-Triggered-At'),
  };
}

/**
 * Standard Webhooks (Svix, Resend, ...): `entity` is yours (the spec does not say where a
 * payload's object is), the version the `webhook-timestamp` header (whole seconds) unless you give
 * `version`. The timestamp is when the delivery was signed and sent: a retry of an older event is
 * signed later and looks newer. It orders first deliveries only; give a version from the payload
 * (an object's `updated_at` or revision) when the sender has one.
 */
export function standardWebhookOrder(
  entity: EventOrderExtractor,
  options: { version?: EventOrderExtractor } = {},
): EventOrderOptions {
  return {
    entity,
    version:
      options.version ??
      ((_body: unknown, request: { headers?: Headers }) => headerValue(request, 'webhook-timestamp')),
  };
}
