import { readFileSync } from 'node:fs';
import { describe, expect, it } from '@jest/globals';
import * as errors from '../../lib/errors/index.js';
import * as root from '../../lib/index.js';
import * as observability from '../../lib/observability/index.js';
import * as operator from '../../lib/operator/index.js';
import * as testing from '../../lib/testing/index.js';

/** The most runtime names the root entry may have: what an app calls, and no more. */
const ROOT_LIMIT = 32;

/** The runtime names of an entry (types leave nothing at run time), sorted. */
const names = (entry: object) => Object.keys(entry).sort();

/**
 * The package's entry points by what they export at run time. Each list is written out, so that a
 * name added to an entry is added here on purpose: the root stays what an app imports to make its
 * handlers idempotent, and what only an operator's tool or a monitoring set-up imports goes on its
 * own entry (docs/compatibility.md, "Entry points", says which is where).
 */
describe('the public surface', () => {
  it(`has at most ${ROOT_LIMIT} runtime names at the root`, () => {
    expect(names(root).length).toBeLessThanOrEqual(ROOT_LIMIT);
  });

  it('has at the root the module, the decorators, the context, presets, guards, errors, headers and table', () => {
    expect(names(root)).toEqual(
      [
        // The module and making handlers idempotent.
        'IdempotencyModule',
        'IdempotentWebhook',
        'IdempotentRequest',
        'Idempotent',
        'IdempotentWorker',
        'WebhookTransaction',
        'IdempotencyInterceptor',
        'IdempotencyService',
        'IdempotencyContext',
        'Propagation',
        // Key and order presets.
        'githubDeliveryKey',
        'shopifyWebhookKey',
        'standardWebhookKey',
        'stripeEventKey',
        'shopifyWebhookOrder',
        'standardWebhookOrder',
        'stripeEventOrder',
        // Signature guards.
        'WebhookSignatureGuard',
        'StripeSignatureGuard',
        'GithubSignatureGuard',
        'StandardWebhooksSignatureGuard',
        'ShopifySignatureGuard',
        // The error family: the base, the one signature error, the check by code.
        'IdempotencyError',
        'WebhookSignatureError',
        'isIdempotencyError',
        // The answers' headers.
        'REPLAYED_HEADER',
        'STALE_HEADER',
        // The claims table.
        'ProcessedEvent',
        'ProcessedEventVersion',
        'idempotencyEntities',
        'processedEventsMigrations',
        // The reporter every external-mode app runs.
        'ExpiredLeaseReporter',
      ].sort(),
    );
  });

  it('has every error class on the errors entry, the root three among them as the same objects', () => {
    expect(names(errors)).toEqual(
      [
        'EventInFlightError',
        'IdempotencyError',
        'IdempotencyKeyReusedError',
        'IdempotencyOwnerUnknownError',
        'IdempotencyUnavailableError',
        'InvalidEventOrderError',
        'InvalidIdempotencyKeyError',
        'MissingIdempotencyKeyError',
        'PropagationError',
        'ResponseNotStoredError',
        'TransactionAbortedError',
        'UnparsedRequestBodyError',
        'WebhookSignatureError',
        'isIdempotencyError',
      ].sort(),
    );
    const shared = names(errors).filter((name) => name in root);
    expect(shared).toEqual(['IdempotencyError', 'WebhookSignatureError', 'isIdempotencyError']);
    for (const name of shared) {
      expect(errors[name as keyof typeof errors]).toBe(root[name as keyof typeof root]);
    }
  });

  it('has the operator tools and the observability parts on their own entries, none at the root', () => {
    expect(names(operator)).toEqual(['HandoffQueues', 'IdempotencyClaims', 'IdempotencyConsoleModule']);
    expect(names(observability)).toEqual([
      'HandoffMetrics',
      'IDEMPOTENCY_CHANNELS',
      'IdempotencyHealthIndicator',
      'IdempotencyMetrics',
    ]);
    for (const entry of [operator, observability, testing]) {
      expect(names(entry).filter((name) => name in root)).toEqual([]);
    }
  });

  it('publishes each entry in package.json, for import and require', () => {
    const manifest = JSON.parse(readFileSync('package.json', 'utf8')) as {
      exports: Record<string, unknown>;
      typesVersions: { '*': Record<string, string[]> };
    };
    const subpaths = ['./errors', './observability', './operator', './testing'];
    expect(Object.keys(manifest.exports).sort()).toEqual(['.', ...subpaths, './package.json'].sort());
    expect(Object.keys(manifest.typesVersions['*']).sort()).toEqual(subpaths.map((path) => path.slice(2)));
  });
});
