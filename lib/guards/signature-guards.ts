import type { Type } from '@nestjs/common';
import type { WebhookSignatureName, WebhookSignatureOptions } from '../interfaces/index.js';
import { GithubSignatureGuard } from './github-signature.guard.js';
import { ShopifySignatureGuard } from './shopify-signature.guard.js';
import { StandardWebhooksSignatureGuard } from './standard-webhooks-signature.guard.js';
import { StripeSignatureGuard } from './stripe-signature.guard.js';
import type { WebhookSignatureGuard } from './webhook-signature.guard.js';

/** One sender's guard: its `@IdempotentWebhook({ signature })` name and its `signatures` option. */
export interface SignatureGuardEntry {
  name: WebhookSignatureName;
  option: keyof WebhookSignatureOptions;
  guard: Type<WebhookSignatureGuard>;
}

/** Every shipped guard, for the decorator option and the boot check. */
export const SIGNATURE_GUARDS: readonly SignatureGuardEntry[] = [
  { name: 'stripe', option: 'stripe', guard: StripeSignatureGuard },
  { name: 'github', option: 'github', guard: GithubSignatureGuard },
  { name: 'standard-webhooks', option: 'standardWebhooks', guard: StandardWebhooksSignatureGuard },
  { name: 'shopify', option: 'shopify', guard: ShopifySignatureGuard },
];

/** The guard `@IdempotentWebhook({ signature: name })` applies, or undefined for an unknown name. */
export function signatureGuardNamed(name: unknown): Type<WebhookSignatureGuard> | undefined {
  return SIGNATURE_GUARDS.find((entry) => entry.name === name)?.guard;
}

/**
 * The entry of a guard found in `@UseGuards` metadata (a class or an instance), including a
 * user's subclass of a shipped guard; undefined for any other guard.
 */
export function signatureGuardEntry(guard: unknown): SignatureGuardEntry | undefined {
  const type = typeof guard === 'function' ? guard : (guard as { constructor?: unknown } | null)?.constructor;
  if (typeof type !== 'function') return undefined;
  return SIGNATURE_GUARDS.find((entry) => type === entry.guard || type.prototype instanceof entry.guard);
}
