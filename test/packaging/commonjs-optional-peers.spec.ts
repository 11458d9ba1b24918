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

/**
 * What requiring each entry point of the CommonJS build loads: none of the optional peers (and not
 * stripe, pg-boss or @nestjs/microservices, which a delivery loads when it needs them), so an app
 * that installed none of them can require every entry. require.cache holds a module from the moment
 * it is required, whether through require() or require(esm).
 */
describe('the CommonJS entry points', () => {
  const OPTIONAL_PEERS = [
    '@nestjs-cls/transactional',
    '@nestjs/microservices',
    '@nestjs/schedule',
    '@nestjs/terminus',
    '@opentelemetry/api',
    'nestjs-cls',
    'pg-boss',
    'prom-client',
    'stripe',
  ];
  const ENTRIES = [
    'index.js',
    'errors/index.js',
    'operator/index.js',
    'observability/index.js',
    'testing/index.js',
  ];

  it.each(ENTRIES)('%s loads, with none of the optional peers', (entry) => {
    const seen = JSON.parse(
      execFileSync(
        process.execPath,
        [
          '-e',
          `
          require('reflect-metadata');
          const exported = require('./dist/cjs/${entry}');
          const peers = ${JSON.stringify(OPTIONAL_PEERS)};
          const files = Object.keys(require.cache).map((file) => file.split('/node_modules/').pop());
          console.log(JSON.stringify({
            names: Object.keys(exported).filter((name) => name !== '__esModule').length,
            peers: peers.filter((peer) => files.some((file) => file.startsWith(peer + '/'))),
          }));
          `,
        ],
        { encoding: 'utf8', env: { ...process.env, NODE_OPTIONS: '' } },
      ),
    ) as { names: number; peers: string[] };
    expect(seen.names).toBeGreaterThan(0);
    expect(seen.peers).toEqual([]);
  });
});
