import { createHmac } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import Stripe from 'stripe';

/**
 * Signatures as each sender makes them: Stripe's and Standard Webhooks' with their own SDKs,
 * GitHub's and Shopify's with the HMAC their documentation specifies (neither ships a signing
 * SDK; GitHub's documented test vector pins the algorithm in the tests).
 */

/** `Stripe-Signature` for `payload`, from the stripe SDK's test helper; `timestamp` in Unix seconds. */
export function stripeSignature(payload: string, secret: string, timestamp?: number): string {
  return Stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp });
}

/** `X-Hub-Signature-256`: `sha256=` + hex HMAC-SHA256 of the body, keyed with the webhook secret. */
export function githubSignature(payload: string, secret: string): string {
  return `sha256=${createHmac('sha256', secret).update(payload, 'utf8').digest('hex')}`;
}

/** `X-Shopify-Hmac-Sha256`: base64 HMAC-SHA256 of the body, keyed with the app's client secret. */
export function shopifySignature(payload: string, secret: string): string {
  return createHmac('sha256', secret).update(payload, 'utf8').digest('base64');
}

/** The three Standard Webhooks headers for one message, signed by the standardwebhooks SDK. */
export function standardWebhookHeaders(
  id: string,
  payload: string,
  secret: string,
  timestamp: Date = new Date(),
): Record<'webhook-id' | 'webhook-timestamp' | 'webhook-signature', string> {
  return {
    'webhook-id': id,
    'webhook-timestamp': String(Math.floor(timestamp.getTime() / 1000)),
    'webhook-signature': new Webhook(secret).sign(id, timestamp, payload),
  };
}

/** A Standard Webhooks secret (`whsec_` + base64 of `seed` padded to 32 bytes), as a sender issues one. */
export function standardWebhookSecret(seed: string): string {
  return `whsec_${Buffer.from(seed.padEnd(32, '.')).toString('base64')}`;
}
