import 'reflect-metadata';
import { describe, expect, it } from '@jest/globals';
import { GUARDS_METADATA, INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import {
  GithubSignatureGuard,
  githubDeliveryKey,
  IdempotencyInterceptor,
  IdempotentWebhook,
  ShopifySignatureGuard,
  shopifyWebhookKey,
  StandardWebhooksSignatureGuard,
  standardWebhookKey,
  StripeSignatureGuard,
  type IdempotentWebhookOptions,
  type WebhookSignatureName,
} from '../../lib/index.js';

/** A handler decorated with `@IdempotentWebhook(options)`, as its method function. */
function decorated(options: IdempotentWebhookOptions): object {
  class Handlers {
    handle() {
      return undefined;
    }
  }
  const descriptor = Object.getOwnPropertyDescriptor(Handlers.prototype, 'handle')!;
  IdempotentWebhook(options)(Handlers.prototype, 'handle', descriptor);
  return Handlers.prototype.handle;
}

describe('@IdempotentWebhook({ signature })', () => {
  it.each([
    ['stripe', StripeSignatureGuard],
    ['github', GithubSignatureGuard],
    ['standard-webhooks', StandardWebhooksSignatureGuard],
    ['shopify', ShopifySignatureGuard],
  ] as const)("'%s' applies %p with the interceptor", (signature, guard) => {
    const handler = decorated({ key: (event: { id: string }) => event.id, signature });
    expect(Reflect.getMetadata(GUARDS_METADATA, handler)).toEqual([guard]);
    expect(Reflect.getMetadata(INTERCEPTORS_METADATA, handler)).toContain(IdempotencyInterceptor);
  });

  it('applies no guard without the option', () => {
    expect(Reflect.getMetadata(GUARDS_METADATA, decorated({ key: () => 'k' }))).toBeUndefined();
  });

  it.each(['paypal', 'Stripe', 'standardWebhooks', '', 42])(
    'refuses %p at decoration time with a TypeError listing the senders',
    (signature) => {
      expect(() =>
        IdempotentWebhook({ key: () => 'k', signature: signature as WebhookSignatureName }),
      ).toThrow(
        new TypeError(
          `@IdempotentWebhook option signature must be one of 'stripe', 'github', 'standard-webhooks', 'shopify', got ${typeof signature === 'string' ? `'${signature}'` : String(signature)}`,
        ),
      );
    },
  );
});

describe('delivery-header key presets', () => {
  it.each([
    ['githubDeliveryKey', githubDeliveryKey, 'X-GitHub-Delivery'],
    ['shopifyWebhookKey', shopifyWebhookKey, 'X-Shopify-Webhook-Id'],
    ['standardWebhookKey', standardWebhookKey, 'webhook-id'],
  ] as const)('%s names %s when it is missing or empty', (_name, extract, header) => {
    expect(extract({}, { headers: { [header.toLowerCase()]: 'delivery-1' } })).toBe('delivery-1');
    expect(() => extract({}, { headers: {} })).toThrow(new Error(`${header} header is missing`));
    expect(() => extract({}, {})).toThrow(new Error(`${header} header is missing`));
    expect(() => extract({}, { headers: { [header.toLowerCase()]: '' } })).toThrow(
      new Error(`${header} header is empty`),
    );
  });
});
