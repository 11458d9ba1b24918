import type { IdempotencyKeyExtractor } from '../interfaces/index.js';

/** Reads a header the same way on Express and Fastify (both lower-case incoming names). */
const header =
  (name: string): IdempotencyKeyExtractor =>
  (_body, request: { headers?: Record<string, string | string[] | undefined> }) =>
    request.headers?.[name];

/** Stripe: the event's `evt_...` id in the body (not the object id: one charge has many events). */
export const stripeEventKey: IdempotencyKeyExtractor = (event: { id?: unknown }) => event.id;

/** GitHub: the `X-GitHub-Delivery` GUID, the same on redeliveries of one delivery. */
export const githubDeliveryKey: IdempotencyKeyExtractor = header('x-github-delivery');

/** Shopify: `X-Shopify-Webhook-Id`, the same on retries of one webhook. */
export const shopifyWebhookKey: IdempotencyKeyExtractor = header('x-shopify-webhook-id');

/** Standard Webhooks (Svix, Resend, ...): the `webhook-id` header, the same on retries. */
export const standardWebhookKey: IdempotencyKeyExtractor = header('webhook-id');
