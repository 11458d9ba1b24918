import { describe, expect, it } from '@jest/globals';
import { githubDeliveryKey, shopifyWebhookKey, standardWebhookKey, stripeEventKey } from '../../lib/index.js';

describe('key presets', () => {
  it("stripeEventKey takes the event's evt_ id, not the object's", () => {
    const event = { id: 'evt_1', type: 'charge.succeeded', data: { object: { id: 'ch_1' } } };
    expect(stripeEventKey(event, {})).toBe('evt_1');
  });

  it.each([
    ['githubDeliveryKey', githubDeliveryKey, 'x-github-delivery'],
    ['shopifyWebhookKey', shopifyWebhookKey, 'x-shopify-webhook-id'],
    ['standardWebhookKey', standardWebhookKey, 'webhook-id'],
  ] as const)('%s reads the %s header (lower-cased by Express and Fastify)', (_name, extract, header) => {
    expect(extract({ id: 'not-this' }, { headers: { [header]: 'delivery-1' } })).toBe('delivery-1');
  });

  it('answers a missing id with undefined, a missing header by naming it, so the 400 says which', () => {
    expect(stripeEventKey({}, {})).toBeUndefined();
    expect(() => githubDeliveryKey({}, { headers: {} })).toThrow('X-GitHub-Delivery header is missing');
    expect(() => standardWebhookKey({}, {})).toThrow('webhook-id header is missing');
  });
});
