import { headerEmpty, headerMissing } from '../idempotency.messages.js';
import type { IdempotencyKeyExtractor } from '../interfaces/index.js';

/**
 * Reads a delivery header the same way on Express and Fastify (both lower-case incoming names).
 * A missing or empty one throws, naming the header as the sender documents it: the interceptor
 * answers a throwing extractor with 400 ("Idempotency key extractor of Class.method threw:
 * X-GitHub-Delivery header is missing") and writes nothing.
 */
const header =
  (display: string): IdempotencyKeyExtractor =>
  (_body, request: { headers?: Record<string, string | string[] | undefined> }) => {
    const value = request?.headers?.[display.toLowerCase()];
    if (value === undefined) throw new Error(headerMissing(display));
    if (value === '') throw new Error(headerEmpty(display));
    return value;
  };

/** Stripe: the event's `evt_...` id in the body (not the object id: one charge has many events). */
export const stripeEventKey: IdempotencyKeyExtractor = (event: { id?: unknown }) => event.id;

/** GitHub: the `X-GitHub-Delivery` GUID, the same on redeliveries of one delivery. */
export const githubDeliveryKey: IdempotencyKeyExtractor = header('X-GitHub-Delivery');

/** Shopify: `X-Shopify-Webhook-Id`, the same on retries of one webhook. */
export const shopifyWebhookKey: IdempotencyKeyExtractor = header('X-Shopify-Webhook-Id');

/** Standard Webhooks (Svix, Resend, ...): the `webhook-id` header, the same on retries. */
export const standardWebhookKey: IdempotencyKeyExtractor = header('webhook-id');
