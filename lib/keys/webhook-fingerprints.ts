import { createHash } from 'node:crypto';
import type { WebhookFingerprint, WebhookSignatureName } from '../interfaces/index.js';
import { stripeEventKey } from './webhook-keys.js';

/** A fingerprint function over a delivery's `(body, request)` (or `(data, context)` over RPC). */
export type FingerprintOf = (body: unknown, request: unknown) => string | null;

/** The request fields the presets read; the same on Express's request and Fastify's. */
interface DeliveredRequest {
  rawBody?: unknown;
}

/** SHA-256, hex: what is stored in the claim's `fingerprint` column, whatever was hashed. */
export function sha256Hex(...parts: (string | Uint8Array)[]): string {
  const hash = createHash('sha256');
  for (const part of parts) hash.update(part);
  return hash.digest('hex');
}

/**
 * The bytes a delivery carried: the raw body when the app keeps it (`rawBody: true`), else the
 * parsed body serialised again (the same bytes for the same JSON, spacing aside), else nothing.
 */
export function deliveredBytes(body: unknown, request: unknown): string | Uint8Array {
  const raw = (request as DeliveredRequest | undefined)?.rawBody;
  if (raw instanceof Uint8Array) return raw;
  if (typeof body === 'string') return body;
  return JSON.stringify(body ?? null) ?? '';
}

/**
 * Stripe resends an event with `pending_webhooks` counted down (how many endpoints have not yet
 * acknowledged it); everything else in the event is the same on every copy. The fingerprint
 * leaves that field out, so two copies of one event match and two events do not.
 */
const stripeFingerprint: FingerprintOf = (body) => {
  if (typeof body !== 'object' || body === null || Array.isArray(body))
    return sha256Hex(JSON.stringify(body ?? null));
  const event = { ...(body as Record<string, unknown>) };
  delete event.pending_webhooks;
  return sha256Hex(JSON.stringify(event));
};

/**
 * The body as delivered. GitHub, Shopify and Standard Webhooks senders resend the same body and
 * change only their delivery headers (`X-GitHub-Delivery` stays, `X-Hub-Signature-256`,
 * `X-Shopify-Triggered-At`, `webhook-timestamp` and `webhook-signature` may not): headers are
 * not part of the fingerprint.
 */
const bodyFingerprint: FingerprintOf = (body, request) => sha256Hex(deliveredBytes(body, request));

/** The presets, by name. */
const PRESETS: Record<Exclude<WebhookFingerprint, false | ((...args: any[]) => unknown)>, FingerprintOf> = {
  stripe: stripeFingerprint,
  github: bodyFingerprint,
  shopify: bodyFingerprint,
  'standard-webhooks': bodyFingerprint,
  body: bodyFingerprint,
};

/** The preset names, for the option check. */
export const FINGERPRINT_PRESETS = Object.keys(PRESETS);

/**
 * The fingerprint function of a webhook handler: its `fingerprint` option (a preset, a function of
 * its own, hashed, or false: none), by default the preset of its sender, known from `signature`
 * or a Stripe key (`stripeEventKey`), else the body as delivered. Undefined for an unknown name.
 */
export function webhookFingerprint(
  option: WebhookFingerprint | undefined,
  signature: WebhookSignatureName | undefined,
  key: unknown,
): FingerprintOf | false | undefined {
  if (option === false) return false;
  if (typeof option === 'function') {
    return (body, request) => {
      const value = option(body, request);
      if (value === undefined || value === null) return null;
      return sha256Hex(
        value instanceof Uint8Array ? value : typeof value === 'string' ? value : JSON.stringify(value),
      );
    };
  }
  if (option !== undefined) return Object.hasOwn(PRESETS, option) ? PRESETS[option] : undefined;
  if (signature === 'stripe' || key === stripeEventKey) return stripeFingerprint;
  return bodyFingerprint;
}
