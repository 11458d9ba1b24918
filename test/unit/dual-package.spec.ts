import { execFileSync } from 'node:child_process';
import { describe, expect, it } from '@jest/globals';

/**
 * Both builds loaded into one plain Node process, as happens when an ESM app has a CommonJS
 * dependency that requires the package. Runs the built files (`npm test` builds first) in a child
 * process, outside Jest's module system, with this repository's Nest 12 (which the CommonJS build
 * loads through require(esm)).
 */
describe('the ESM and CommonJS builds in one process', () => {
  function inNode(script: string): unknown {
    const output = execFileSync(process.execPath, ['--input-type=module', '-e', script], {
      encoding: 'utf8',
      env: { ...process.env, NODE_OPTIONS: '' },
    });
    return JSON.parse(output);
  }

  it('export the same names', () => {
    const names = inNode(`
      import { createRequire } from 'node:module';
      const require = createRequire(import.meta.url);
      const names = async (entry) => ({
        esm: Object.keys(await import('./dist/lib/' + entry)).sort(),
        cjs: Object.keys(require('./dist/cjs/' + entry)).filter((name) => name !== '__esModule').sort(),
      });
      console.log(JSON.stringify([await names('index.js'), await names('testing/index.js')]));
    `) as { esm: string[]; cjs: string[] }[];
    for (const { esm, cjs } of names) {
      expect(esm.length).toBeGreaterThan(0);
      expect(cjs).toEqual(esm);
    }
  });

  it('share the current delivery: one build opens it, the other reads it', () => {
    const seen = inNode(`
      import { createRequire } from 'node:module';
      import 'reflect-metadata';
      const require = createRequire(import.meta.url);
      const esm = await import('./dist/lib/index.js');
      const esmTesting = await import('./dist/lib/testing/index.js');
      const cjs = require('./dist/cjs/index.js');
      const cjsTesting = require('./dist/cjs/testing/index.js');
      const manager = {};
      const read = (context) => ({ active: context.active, key: context.key, same: context.manager === manager });
      console.log(JSON.stringify({
        distinctClasses: esm.IdempotencyContext !== cjs.IdempotencyContext,
        esmReadsCjs: cjsTesting.runAsWebhookDelivery({ key: 'k1', manager }, () => read(new esm.IdempotencyContext())),
        cjsReadsEsm: esmTesting.runAsWebhookDelivery({ key: 'k2', manager }, () => read(new cjs.IdempotencyContext())),
        outside: [new esm.IdempotencyContext().active, new cjs.IdempotencyContext().active],
      }));
    `);
    expect(seen).toEqual({
      distinctClasses: true,
      esmReadsCjs: { active: true, key: 'k1', same: true },
      cjsReadsEsm: { active: true, key: 'k2', same: true },
      outside: [false, false],
    });
  });
});
