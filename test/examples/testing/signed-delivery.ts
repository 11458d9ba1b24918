import Stripe from 'stripe';
import request from 'supertest';

/**
 * One delivery of `event` to `path` as Stripe makes it, for `deliver`: signed anew on every call
 * (a retry carries a fresh timestamp, as Stripe's does). `server` is `app.getHttpServer()`, on
 * Fastify as on Express.
 */
export function signedStripeDelivery(
  server: Parameters<typeof request>[0],
  path: string,
  event: object,
  secret: string,
) {
  return () => {
    const payload = JSON.stringify(event);
    return request(server)
      .post(path)
      .set('content-type', 'application/json')
      .set('stripe-signature', Stripe.webhooks.generateTestHeaderString({ payload, secret }))
      .send(payload);
  };
}
