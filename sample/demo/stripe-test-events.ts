import { randomBytes } from 'node:crypto';
import Stripe from 'stripe';

/** Event types the sample's handlers act on. */
export type SampleEventType = 'payment_intent.succeeded' | 'checkout.session.completed';

/** A new `evt_...` id, so a demo run is never mistaken for an earlier one. */
export function newEventId(prefix = 'evt_demo'): string {
  return `${prefix}_${randomBytes(8).toString('hex')}`;
}

/**
 * A minimal but well-formed Stripe event of `type`, as `stripe trigger` would send it. Only the
 * fields the sample reads are filled in.
 */
export function testEvent(type: SampleEventType, id = newEventId()): Record<string, unknown> {
  const suffix = id.slice(-16);
  const object =
    type === 'payment_intent.succeeded'
      ? {
          id: `pi_${suffix}`,
          object: 'payment_intent',
          amount: 2000,
          amount_received: 2000,
          currency: 'usd',
          status: 'succeeded',
        }
      : {
          id: `cs_test_${suffix}`,
          object: 'checkout.session',
          status: 'complete',
          payment_status: 'paid',
          customer_details: { email: 'jenny.rosen@example.com' },
        };
  return stripeEvent(id, type, object);
}

/** The envelope Stripe puts around every event's `data.object`. */
export function stripeEvent(
  id: unknown,
  type: string,
  object: Record<string, unknown>,
): Record<string, unknown> {
  return {
    id,
    object: 'event',
    api_version: Stripe.API_VERSION,
    created: Math.floor(Date.now() / 1000),
    livemode: false,
    pending_webhooks: 1,
    request: { id: null, idempotency_key: null },
    type,
    data: { object },
  };
}

/** The `Stripe-Signature` header Stripe would send for exactly these bytes. */
export function signPayload(payload: string, secret: string): string {
  return Stripe.webhooks.generateTestHeaderString({ payload, secret });
}
