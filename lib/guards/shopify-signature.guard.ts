import { Injectable } from '@nestjs/common';
import { headerMalformed } from '../idempotency.messages.js';
import type { SignedRequest } from './raw-body.js';
import { decodeBase64 } from './signature-crypto.js';
import { requireBodyHmac, requireHeader, WebhookSignatureError } from './webhook-signature.error.js';
import { WebhookSignatureGuard } from './webhook-signature.guard.js';

/** Shopify's signature header, as its documentation spells it. */
export const SHOPIFY_SIGNATURE_HEADER = 'X-Shopify-Hmac-Sha256';

/** An HMAC-SHA256 digest is 32 bytes. */
const DIGEST_BYTES = 32;

/**
 * Shopify's check: `X-Shopify-Hmac-Sha256` is the base64 HMAC-SHA256 of the raw body, keyed with
 * the app's client secret, compared in constant time. Shopify signs no timestamp.
 */
export function verifyShopifySignature(rawBody: Buffer, header: unknown, secrets: readonly string[]): void {
  const value = requireHeader(header, SHOPIFY_SIGNATURE_HEADER);
  const received = decodeBase64(value);
  if (received?.length !== DIGEST_BYTES) {
    throw new WebhookSignatureError(
      'malformed',
      SHOPIFY_SIGNATURE_HEADER,
      headerMalformed(SHOPIFY_SIGNATURE_HEADER, 'the base64 of a 32-byte HMAC-SHA256'),
    );
  }
  requireBodyHmac(SHOPIFY_SIGNATURE_HEADER, rawBody, secrets, received);
}

/**
 * Lets a Shopify delivery through only if `X-Shopify-Hmac-Sha256` matches its raw body under
 * `signatures.shopify.secret`: `@UseGuards(ShopifySignatureGuard)` or
 * `@IdempotentWebhook({ key: shopifyWebhookKey, signature: 'shopify' })`. Needs `rawBody: true`.
 */
@Injectable()
export class ShopifySignatureGuard extends WebhookSignatureGuard {
  protected readonly option = 'shopify';
  protected readonly headers = [{ name: 'x-shopify-hmac-sha256', display: SHOPIFY_SIGNATURE_HEADER }];

  protected verify(request: SignedRequest, rawBody: Buffer, secrets: readonly string[]): void {
    verifyShopifySignature(rawBody, request.headers['x-shopify-hmac-sha256'], secrets);
  }
}
