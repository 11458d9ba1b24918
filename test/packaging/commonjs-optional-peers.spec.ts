import { execFileSync } from 'node:child_process';
import { describe, expect, it } from '@jest/globals';

/**
 * How the CommonJS build loads its optional peers, in a plain Node child process (the built
 * files; `npm test` builds first): through require(), so a CommonJS app and the library share one
 * copy of each peer, and an ES-only peer (Nest 12) through require(esm).
 */
describe('optional peers in the CommonJS build', () => {
  const loaded = JSON.parse(
    execFileSync(
      process.execPath,
      [
        '-e',
        `
        const { loadOptionalPeer } = require('./dist/cjs/core/optional-peer.js');
        const { loadStripeWebhooks } = require('./dist/cjs/guards/stripe-signature.guard.js');
        const { loadStatementClassifier } = require('./dist/cjs/postgres/statement.classifier.js');
        (async () => {
          const prom = await loadOptionalPeer('prom-client');
          const microservices = await loadOptionalPeer('@nestjs/microservices');
          const webhooks = await loadStripeWebhooks();
          const missing = await loadOptionalPeer('no-such-peer').then(() => 'loaded', (error) => error.code);
          // libpg-query is a dependency, loaded the same way: required, one copy with the app's.
          const parser = await loadOptionalPeer('libpg-query');
          const classifier = await loadStatementClassifier();
          console.log(JSON.stringify({
            promIsRequired: prom === require('prom-client'),
            microservicesIsRequired: microservices === require('@nestjs/microservices'),
            rpcException: typeof microservices.RpcException,
            stripeIsRequired: webhooks === require('stripe').webhooks,
            missing,
            parserIsRequired: parser === require('libpg-query'),
            classified: classifier.classify('-- note\\nDELETE FROM orders').effect,
          }));
        })();
        `,
      ],
      { encoding: 'utf8', env: { ...process.env, NODE_OPTIONS: '' } },
    ),
  );

  it('requires a CommonJS peer: the same module as the app gets', () => {
    expect(loaded.promIsRequired).toBe(true);
  });

  it('requires an ES-only peer through require(esm)', () => {
    expect(loaded).toMatchObject({ microservicesIsRequired: true, rpcException: 'function' });
  });

  it("finds stripe's webhooks on the required SDK (no default export in CommonJS)", () => {
    expect(loaded.stripeIsRequired).toBe(true);
  });

  it("requires PostgreSQL's parser (libpg-query) and classifies on it", () => {
    expect(loaded).toMatchObject({ parserIsRequired: true, classified: 'write' });
  });

  it('rejects for a peer that is not installed, so callers can go without it', () => {
    expect(loaded.missing).toBe('MODULE_NOT_FOUND');
  });
});
