import { z } from 'zod';

/**
 * The shape of each Stripe event the sample acts on, as zod schemas: every field a handler reads,
 * with the bounds of the column it is written to. The signature guard proves an event came from
 * Stripe; this proves it has what the handler needs, before any write. Parsing returns only these
 * fields, so a handler cannot read one that was not checked (its types come from here).
 */

/** PostgreSQL's `integer`, the type of `orders.amount`. */
const INTEGER_MAX = 2_147_483_647;

/**
 * Text that PostgreSQL keeps as it was sent, in a column or inside a job's JSON: no NUL (text
 * cannot hold one: the write would fail, a 500), and no lone UTF-16 surrogate (stored as U+FFFD
 * in a column, a different id than was sent; refused inside JSON). `\p{Cs}` with the `u` flag
 * matches only a surrogate that is not half of a pair.
 */
const storableText = z
  .string()
  .refine((text) => !text.includes('\u0000'), 'must not contain a NUL character')
  .refine((text) => !/\p{Cs}/u.test(text), 'must not contain a lone UTF-16 surrogate');

/** A Stripe object id (`pi_...`, `in_...`, `cs_...`), as the sample stores it: `varchar(255)`. */
const objectId = storableText.min(1).max(255);

/**
 * What every event carries, of any type: its id (already checked as the claim's key) and its
 * type, which the answer repeats (so it is bounded).
 */
export const stripeEventEnvelope = z.object({ id: z.string(), type: z.string().min(1).max(255) });

/** An event of `type` whose `data.object` is `object`. */
function stripeEvent<Type extends string, Shape extends z.ZodType>(type: Type, object: Shape) {
  return z.object({ id: z.string(), type: z.literal(type), data: z.object({ object }) });
}

/** `payment_intent.succeeded`: an order of `amount_received` in `currency`. */
export const paymentIntentSucceededEvent = stripeEvent(
  'payment_intent.succeeded',
  z.object({
    id: objectId,
    // In the currency's smallest unit: a whole number that fits the column.
    amount_received: z.number().min(0).max(INTEGER_MAX).int(),
    currency: z.string().regex(/^[a-z]{3}$/, 'expected a three-letter ISO currency code in lower case'),
  }),
);

/** `invoice.paid`: the invoice to mark paid. */
export const invoicePaidEvent = stripeEvent('invoice.paid', z.object({ id: objectId }));

/** `checkout.session.completed`: the session to fulfil, and where to reach its customer. */
export const checkoutSessionCompletedEvent = stripeEvent(
  'checkout.session.completed',
  z.object({
    id: objectId,
    customer_details: z.object({ email: storableText.nullish() }).nullish(),
    customer_email: storableText.nullish(),
  }),
);

/** Stripe's subscription statuses (`Stripe.Subscription.Status`). */
const SUBSCRIPTION_STATUSES = [
  'incomplete',
  'incomplete_expired',
  'trialing',
  'active',
  'past_due',
  'canceled',
  'unpaid',
  'paused',
] as const;

/**
 * A `customer.subscription.*` event: the subscription's snapshot, and the event's own `created`
 * (whole seconds), which orders the subscription's events (the ordering guard reads it before
 * this schema runs, and refuses an event without it).
 */
function subscriptionEvent<Type extends string>(type: Type) {
  return z.object({
    id: z.string(),
    type: z.literal(type),
    created: z.number().int().positive(),
    data: z.object({ object: z.object({ id: objectId, status: z.enum(SUBSCRIPTION_STATUSES) }) }),
  });
}

/** `customer.subscription.created`, `.updated`, `.deleted` (the last with status `canceled`). */
export const subscriptionCreatedEvent = subscriptionEvent('customer.subscription.created');
export const subscriptionUpdatedEvent = subscriptionEvent('customer.subscription.updated');
export const subscriptionDeletedEvent = subscriptionEvent('customer.subscription.deleted');

/** A validated `payment_intent.succeeded`. */
export type PaymentIntentSucceededEvent = z.output<typeof paymentIntentSucceededEvent>;
/** A validated `invoice.paid`. */
export type InvoicePaidEvent = z.output<typeof invoicePaidEvent>;
/** A validated `checkout.session.completed`. */
export type CheckoutSessionCompletedEvent = z.output<typeof checkoutSessionCompletedEvent>;

/** The schemas of the event types one endpoint acts on, by type. */
export type StripeEventSchemas = Readonly<Record<string, z.ZodType<{ id: string; type: string }>>>;

/** The events `/webhooks/stripe/orders` acts on. */
export const ORDERS_EVENTS = {
  'payment_intent.succeeded': paymentIntentSucceededEvent,
  'invoice.paid': invoicePaidEvent,
} as const satisfies StripeEventSchemas;

/** The events `/webhooks/stripe/subscriptions` acts on: the only types its ordering guard orders. */
export const SUBSCRIPTION_EVENTS = {
  'customer.subscription.created': subscriptionCreatedEvent,
  'customer.subscription.updated': subscriptionUpdatedEvent,
  'customer.subscription.deleted': subscriptionDeletedEvent,
} as const satisfies StripeEventSchemas;

/** The events the fulfilment endpoints act on. */
export const FULFILMENT_EVENTS = {
  'checkout.session.completed': checkoutSessionCompletedEvent,
} as const satisfies StripeEventSchemas;

/** An event of a type the endpoint does not act on: only what every event carries. */
export interface IgnoredStripeEvent {
  id: string;
  type: string;
  ignored: true;
}

/** What an endpoint's handler gets: one of the events it acts on, parsed, or an ignored one. */
export type StripeEventOf<Schemas extends StripeEventSchemas> =
  z.output<Schemas[keyof Schemas]> | IgnoredStripeEvent;

/** What the orders endpoint's handler gets. */
export type OrdersEvent = StripeEventOf<typeof ORDERS_EVENTS>;

/** What the fulfilment endpoints' handlers get. */
export type FulfilmentEvent = StripeEventOf<typeof FULFILMENT_EVENTS>;

/** What the subscriptions endpoint's handler gets. */
export type SubscriptionsEvent = StripeEventOf<typeof SUBSCRIPTION_EVENTS>;
