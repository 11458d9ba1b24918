import Stripe from 'stripe';
import request from 'supertest';
import { stripeEvent } from '../../sample/demo/stripe-test-events.js';

/** The signing secret the e2e tests give the sample (STRIPE_WEBHOOK_SECRET). */
export const SAMPLE_TEST_SECRET = 'whsec_sample_e2e_test_secret';

/** The sample's webhook endpoints. */
export const ORDERS = '/webhooks/stripe/orders';
export const FULFILMENT = '/webhooks/stripe/fulfilment';
export const FULFILMENT_ASYNC = '/webhooks/stripe/fulfilment-async';

/** A delivery that hangs fails the test with a clear error instead of a Jest timeout. */
const ANSWER_DEADLINE_MS = 20_000;

/** A Stripe event as Stripe sends it, built by the sample's own demo helper. */
export { stripeEvent };

/** `payment_intent.succeeded` for intent `pi_<id>`. */
export function paymentIntentSucceeded(id: string, intent: Record<string, unknown> = {}) {
  return stripeEvent(id, 'payment_intent.succeeded', {
    id: `pi_${id}`,
    object: 'payment_intent',
    amount: 4200,
    amount_received: 4200,
    currency: 'eur',
    status: 'succeeded',
    ...intent,
  });
}

/** `checkout.session.completed` for session `cs_<id>`, paid by `email`. */
export function checkoutSessionCompleted(id: string, email = 'jenny.rosen@example.com') {
  return stripeEvent(id, 'checkout.session.completed', {
    id: `cs_${id}`,
    object: 'checkout.session',
    status: 'complete',
    customer_details: { email },
  });
}

/** `invoice.paid` for `invoiceId`. */
export function invoicePaid(id: string, invoiceId: string) {
  return stripeEvent(id, 'invoice.paid', { id: invoiceId, object: 'invoice', status: 'paid' });
}

/** How to sign (or mis-sign) one delivery. */
export interface DeliveryOptions {
  /** @default SAMPLE_TEST_SECRET */
  secret?: string;
  /** Unix seconds the signature claims. @default now */
  timestamp?: number;
  /** Send this header instead of a computed one; null sends none. */
  signature?: string | null;
  /** @default 'application/json' */
  contentType?: string;
}

/** The raw bytes Stripe would send for `body` (a string is sent as is). */
export function payloadOf(body: unknown): string {
  return typeof body === 'string' ? body : JSON.stringify(body);
}

/** The `Stripe-Signature` header for `payload`, from the stripe SDK's own test helper. */
export function signatureFor(payload: string, options: DeliveryOptions = {}): string {
  return Stripe.webhooks.generateTestHeaderString({
    payload,
    secret: options.secret ?? SAMPLE_TEST_SECRET,
    timestamp: options.timestamp,
  });
}

/** POSTs `body` to the sample, signed as Stripe would sign it unless `options` say otherwise. */
export function deliver(baseUrl: string, path: string, body: unknown, options: DeliveryOptions = {}) {
  const payload = payloadOf(body);
  const signature = options.signature === undefined ? signatureFor(payload, options) : options.signature;
  const delivery = request(baseUrl)
    .post(path)
    .set('Content-Type', options.contentType ?? 'application/json')
    .timeout(ANSWER_DEADLINE_MS);
  if (signature !== null) delivery.set('Stripe-Signature', signature);
  return delivery.send(payload);
}

/** The sample's subscriptions endpoint (ordered per subscription). */
export const SUBSCRIPTIONS = '/webhooks/stripe/subscriptions';

/**
 * `customer.subscription.<action>` for subscription `subscriptionId` with `status`, made by Stripe
 * at `created` (Unix seconds): what orders the subscription's events.
 */
export function subscriptionEvent(
  id: string,
  action: 'created' | 'updated' | 'deleted',
  subscriptionId: string,
  status: string,
  created: number,
): Record<string, unknown> & { id: string; created?: number } {
  return {
    ...stripeEvent(id, `customer.subscription.${action}`, {
      id: subscriptionId,
      object: 'subscription',
      status,
      // When the subscription was made: not what orders its events.
      created: 1_600_000_000,
    }),
    id,
    created,
  };
}
