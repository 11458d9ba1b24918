import { describe, expect, it } from '@jest/globals';
import { resolveIdempotencyConfig } from '../../lib/idempotency.config.js';
import type { WebhookSignatureOptions } from '../../lib/index.js';

/** The boot error of `signatures`, or undefined if they are accepted. */
const refusalOf = (signatures: unknown) => {
  try {
    resolveIdempotencyConfig({ signatures: signatures as WebhookSignatureOptions });
  } catch (error) {
    return (error as Error).message;
  }
  return undefined;
};

const WHSEC = `whsec_${Buffer.from('a standard webhooks key of 32 b.').toString('base64')}`;

describe('the signatures option', () => {
  it('is absent unless given, and keeps every sender as given (a string or a rotation array)', () => {
    expect(resolveIdempotencyConfig().signatures).toBeUndefined();
    const signatures: WebhookSignatureOptions = {
      stripe: { secret: 'whsec_stripe', toleranceSeconds: 600 },
      github: { secret: ['current', 'next'] },
      standardWebhooks: { secret: WHSEC },
      shopify: { secret: 'shopify-secret' },
    };
    expect(resolveIdempotencyConfig({ signatures }).signatures).toEqual(signatures);
  });

  it('is copied at boot: changing the caller’s object later changes nothing', () => {
    const secrets = ['current'];
    const config = resolveIdempotencyConfig({ signatures: { github: { secret: secrets } } });
    secrets.push('');
    expect(config.signatures?.github?.secret).toEqual(['current']);
  });

  it('lets a sender spread from an unset environment value be undefined', () => {
    expect(refusalOf({ github: undefined, stripe: { secret: 'whsec_x' } })).toBeUndefined();
  });

  it.each([
    [
      { gitHub: { secret: 'x' } },
      'IdempotencyModule has no option signatures.gitHub; did you mean signatures.github?',
    ],
    [{ standard: { secret: WHSEC } }, 'IdempotencyModule has no option signatures.standard'],
    [
      { stripe: { secret: 'whsec_x', tolerenceSeconds: 300 } },
      'IdempotencyModule has no option signatures.stripe.tolerenceSeconds; did you mean signatures.stripe.toleranceSeconds?',
    ],
    [
      { github: { secret: 'x', toleranceSeconds: 300 } },
      'IdempotencyModule has no option signatures.github.toleranceSeconds',
    ],
    [
      { shopify: { secrets: ['x'] } },
      'IdempotencyModule has no option signatures.shopify.secrets; did you mean signatures.shopify.secret?',
    ],
  ])('refuses unknown keys: %j', (signatures, message) => {
    expect(refusalOf(signatures)).toBe(message);
  });

  it.each([
    [
      { github: { secret: '' } },
      "IdempotencyModule option signatures.github.secret must be a non-empty string, got ''",
    ],
    [
      { github: {} },
      'IdempotencyModule option signatures.github.secret must be a non-empty string, got undefined',
    ],
    [
      { shopify: { secret: [] } },
      'IdempotencyModule option signatures.shopify.secret is an empty array; give at least one secret',
    ],
    [
      { stripe: { secret: ['whsec_a', 42] } },
      'IdempotencyModule option signatures.stripe.secret[1] must be a non-empty string, got 42',
    ],
    [
      { stripe: { secret: 'whsec_a\n' } },
      'IdempotencyModule option signatures.stripe.secret has leading or trailing whitespace (a pasted newline?); every signature would fail',
    ],
    [
      { standardWebhooks: { secret: 'whsec_not base64!' } },
      'IdempotencyModule option signatures.standardWebhooks.secret must be whsec_ followed by the base64 of the key',
    ],
    [
      { standardWebhooks: { secret: 'whsec_' } },
      'IdempotencyModule option signatures.standardWebhooks.secret must be whsec_ followed by the base64 of the key',
    ],
    [
      { stripe: { secret: 'whsec_a', toleranceSeconds: 0 } },
      'IdempotencyModule option signatures.stripe.toleranceSeconds must be a positive number, got 0',
    ],
    [
      { standardWebhooks: { secret: WHSEC, toleranceSeconds: '300' } },
      "IdempotencyModule option signatures.standardWebhooks.toleranceSeconds must be a positive number, got '300'",
    ],
    [
      { github: 'secret' },
      "IdempotencyModule option signatures.github must be an object with a secret, got 'secret'",
    ],
    ['whsec_x', "IdempotencyModule option signatures must be an object, got 'whsec_x'"],
  ])('fails the boot naming the option: %j', (signatures, message) => {
    expect(refusalOf(signatures)).toBe(message);
  });

  it('never prints a secret it refuses for its format', () => {
    const message = refusalOf({ standardWebhooks: { secret: 'whsec_sup3r s3cret!' } });
    expect(message).toBeDefined();
    expect(message).not.toContain('sup3r');
  });
});
