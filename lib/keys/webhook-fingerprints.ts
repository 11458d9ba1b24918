import { hash } from 'node:crypto';
import type { WebhookFingerprint, WebhookSignatureName } from '../interfaces/index.js';
import { stripeEventKey } from './webhook-keys.js';

/** A fingerprint function over a delivery's `(body, request)` (or `(data, context)` over RPC). */
export type FingerprintOf = (body: unknown, request: unknown) => string | null;

/** The request fields the presets read; the same on Express's request and Fastify's. */
interface DeliveredRequest {
  rawBody?: unknown;
}

/**
 * SHA-256, hex: what is stored in the claim's `fingerprint` column, whatever was hashed. One
 * `crypto.hash()` over the parts' bytes, the same digest as `createHash()` updated part by part
 * (claims stored by earlier versions still match): a Hash object per delivery cost the bench
 * server about 20 µs of CPU per delivery more, measured side by side. The callers put a `\n`
 * between their parts, so joining them encodes the same UTF-8 as encoding each part on its own.
 */
export function sha256Hex(...parts: (string | Uint8Array)[]): string {
  if (parts.length === 1) return hash('sha256', parts[0], 'hex');
  if (parts.every((part) => typeof part === 'string')) return hash('sha256', parts.join(''), 'hex');
  return hash(
    'sha256',
    Buffer.concat(parts.map((part) => (typeof part === 'string' ? Buffer.from(part) : part))),
    'hex',
  );
}

/**
 * The bytes a delivery carried: the raw body when the app keeps it (`rawBody: true`), else the
 * parsed body serialised again (the same bytes for the same JSON, spacing aside), else undefined
 * when it cannot be serialised (nested deeper than the stack, a cycle): no fingerprint then.
 */
export function deliveredBytes(body: unknown, request: unknown): string | Uint8Array | undefined {
  const raw = (request as DeliveredRequest | undefined)?.rawBody;
  if (raw instanceof Uint8Array) return raw;
  if (typeof body === 'string') return body;
  try {
    return JSON.stringify(body ?? null) ?? '';
  } catch {
    return undefined;
  }
}

/**
 * Stripe: an event never changes between its copies but for `pending_webhooks` (counted down as
 * endpoints acknowledge it), so its id, type and creation time name its content; two copies match
 * and two events do not. Read from the parsed event, never walking the rest of it (a field nested
 * 40,000 deep costs nothing). A body that is not an event falls back to the body as delivered.
 */
const stripeFingerprint: FingerprintOf = (body, request) => {
  const event = body as { id?: unknown; type?: unknown; created?: unknown } | null | undefined;
  if (typeof event?.id === 'string' && typeof event.type === 'string') {
    return sha256Hex('stripe\n', event.id, '\n', event.type, '\n', String(event.created));
  }
  return bodyFingerprint(body, request);
};

/**
 * The body as delivered. GitHub, Shopify and Standard Webhooks senders resend the same body and
 * change only their delivery headers (`X-GitHub-Delivery` stays, `X-Hub-Signature-256`,
 * `X-Shopify-Triggered-At`, `webhook-timestamp` and `webhook-signature` may not): headers are
 * not part of the fingerprint.
 */
const bodyFingerprint: FingerprintOf = (body, request) => {
  const bytes = deliveredBytes(body, request);
  return bytes === undefined ? null : sha256Hex(bytes);
};

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
