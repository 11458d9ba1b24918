import { execFileSync } from 'node:child_process';
import { describe, expect, it } from '@jest/globals';

/**
 * Both builds loaded into one plain Node process, as happens when an ESM app has a CommonJS
 * dependency that requires the package. Runs the built files (`npm test` builds first) in a child
 * process, outside Jest's module system, with this repository's Nest 12 (which the CommonJS build
 * loads through require(esm)).
 */
/** Every entry point of the package (package.json exports), by its file in either build. */
const ENTRIES = [
  'index.js',
  'errors/index.js',
  'operator/index.js',
  'observability/index.js',
  'testing/index.js',
];

describe('the ESM and CommonJS builds in one process', () => {
  function inNode(script: string): unknown {
    const output = execFileSync(process.execPath, ['--input-type=module', '-e', script], {
      encoding: 'utf8',
      env: { ...process.env, NODE_OPTIONS: '' },
    });
    return JSON.parse(output);
  }

  it('export the same names from every entry point', () => {
    const names = inNode(`
      import { createRequire } from 'node:module';
      const require = createRequire(import.meta.url);
      const names = async (entry) => ({
        esm: Object.keys(await import('./dist/lib/' + entry)).sort(),
        cjs: Object.keys(require('./dist/cjs/' + entry)).filter((name) => name !== '__esModule').sort(),
      });
      console.log(JSON.stringify(await Promise.all(${JSON.stringify(ENTRIES)}.map(names))));
    `) as { esm: string[]; cjs: string[] }[];
    expect(names).toHaveLength(ENTRIES.length);
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

  /** The library's error classes, with arguments their constructors take. */
  const MAKE_ERRORS = `
    const make = (build) => ({
      InvalidIdempotencyKeyError: new build.InvalidIdempotencyKeyError('bad key', 'scope', undefined),
      EventInFlightError: new build.EventInFlightError('in flight', 'scope', 'k', 3),
      IdempotencyUnavailableError: new build.IdempotencyUnavailableError('away', 'scope', 'k', 30, '57P01', new Error('gone')),
      TransactionAbortedError: new build.TransactionAbortedError('aborted', 'scope', 'k'),
    });
    const CLASSES = ['InvalidIdempotencyKeyError', 'EventInFlightError', 'IdempotencyUnavailableError', 'TransactionAbortedError'];
  `;

  it("recognise each other's errors with instanceof: the same class across builds, never another class", () => {
    const seen = inNode(`
      import { createRequire } from 'node:module';
      import 'reflect-metadata';
      const require = createRequire(import.meta.url);
      const esm = await import('./dist/lib/errors/index.js');
      const cjs = require('./dist/cjs/errors/index.js');
      ${MAKE_ERRORS}
      const builds = { esm, cjs };
      const matrix = {};
      for (const [madeBy, maker] of Object.entries(builds)) {
        for (const [name, error] of Object.entries(make(maker))) {
          for (const [checkedBy, checker] of Object.entries(builds)) {
            matrix[madeBy + ' ' + name + ' / ' + checkedBy] = {
              base: error instanceof checker.IdempotencyError,
              error: error instanceof Error,
              classes: CLASSES.filter((other) => error instanceof checker[other]),
            };
          }
        }
      }
      const plain = Object.assign(new Error('look-alike'), { code: 'IDEMPOTENCY_IN_FLIGHT' });
      console.log(JSON.stringify({
        distinctClasses: esm.EventInFlightError !== cjs.EventInFlightError,
        matrix,
        lookAlike: [plain instanceof esm.EventInFlightError, plain instanceof cjs.IdempotencyError],
        notErrors: [null, undefined, 'IDEMPOTENCY_IN_FLIGHT', {}].map((value) => value instanceof esm.IdempotencyError),
      }));
    `) as {
      distinctClasses: boolean;
      matrix: Record<string, unknown>;
      lookAlike: boolean[];
      notErrors: boolean[];
    };
    expect(seen.distinctClasses).toBe(true);
    const expected: Record<string, unknown> = {};
    for (const madeBy of ['esm', 'cjs'])
      for (const name of ERROR_CLASSES)
        for (const checkedBy of ['esm', 'cjs'])
          expected[`${madeBy} ${name} / ${checkedBy}`] = { base: true, error: true, classes: [name] };
    expect(seen.matrix).toEqual(expected);
    // An error that merely looks like one (a code, no brand) is not taken for it.
    expect(seen.lookAlike).toEqual([false, false]);
    expect(seen.notErrors).toEqual([false, false, false, false]);
  });

  it("tell the library's errors, and which one, with isIdempotencyError() from either build", () => {
    const seen = inNode(`
      import { createRequire } from 'node:module';
      import 'reflect-metadata';
      const require = createRequire(import.meta.url);
      const esm = await import('./dist/lib/index.js');
      const cjs = require('./dist/cjs/index.js');
      const esmErrors = await import('./dist/lib/errors/index.js');
      const cjsErrors = require('./dist/cjs/errors/index.js');
      ${MAKE_ERRORS}
      const results = {};
      for (const [madeBy, maker] of Object.entries({ esm: esmErrors, cjs: cjsErrors })) {
        for (const [name, error] of Object.entries(make(maker))) {
          for (const [checkedBy, checker] of Object.entries({ esm, cjs })) {
            results[madeBy + ' ' + name + ' / ' + checkedBy] = {
              any: checker.isIdempotencyError(error),
              own: checker.isIdempotencyError(error, error.code),
              other: checker.isIdempotencyError(error, error.code === 'IDEMPOTENCY_IN_FLIGHT' ? 'IDEMPOTENCY_UNAVAILABLE' : 'IDEMPOTENCY_IN_FLIGHT'),
            };
          }
        }
      }
      const plain = Object.assign(new Error('look-alike'), { code: 'IDEMPOTENCY_IN_FLIGHT' });
      console.log(JSON.stringify({
        results,
        others: [plain, new TypeError('x'), null, undefined, 42, 'IDEMPOTENCY_IN_FLIGHT', {}].map((value) => [
          esm.isIdempotencyError(value),
          cjs.isIdempotencyError(value, 'IDEMPOTENCY_IN_FLIGHT'),
        ]),
      }));
    `) as { results: Record<string, unknown>; others: boolean[][] };
    const expected: Record<string, unknown> = {};
    for (const madeBy of ['esm', 'cjs'])
      for (const name of ERROR_CLASSES)
        for (const checkedBy of ['esm', 'cjs'])
          expected[`${madeBy} ${name} / ${checkedBy}`] = { any: true, own: true, other: false };
    expect(seen.results).toEqual(expected);
    expect(seen.others).toEqual(Array(7).fill([false, false]));
  });

  it("load PostgreSQL's parser, both of them, and classify a commented write as a write", () => {
    const seen = inNode(`
      import { createRequire } from 'node:module';
      const require = createRequire(import.meta.url);
      const esm = await import('./dist/lib/postgres/statement.classifier.js');
      const cjs = require('./dist/cjs/postgres/statement.classifier.js');
      const sql = '/* trace=abc */ INSERT INTO "orders" ("amount") VALUES ($1)';
      const [fromEsm, fromCjs] = await Promise.all([esm.loadStatementClassifier(), cjs.loadStatementClassifier()]);
      console.log(JSON.stringify([fromEsm.classify(sql), fromCjs.classify(sql)]));
    `);
    const write = {
      effect: 'write',
      kind: 'INSERT',
      tables: [{ name: 'orders' }],
      reason: 'writes "orders"',
    };
    expect(seen).toEqual([write, write]);
  });

  it("give, on the operator and observability entries, the very classes each build's module provides", () => {
    const provided = inNode(`
      import { createRequire } from 'node:module';
      import 'reflect-metadata';
      const require = createRequire(import.meta.url);
      const load = async (build, entry) =>
        build === 'esm' ? import('./dist/lib/' + entry) : require('./dist/cjs/' + entry);
      const result = {};
      for (const build of ['esm', 'cjs']) {
        const root = await load(build, 'index.js');
        const exported = Reflect.getMetadata('exports', root.IdempotencyModule);
        for (const entry of ['operator/index.js', 'observability/index.js']) {
          const classes = Object.entries(await load(build, entry)).filter(([, value]) => typeof value === 'function');
          result[build + ' ' + entry] = Object.fromEntries(
            classes.map(([name, value]) => [
              name,
              exported.includes(value) ? 'provided' : typeof value.forRoot === 'function' ? 'a module' : 'neither',
            ]),
          );
        }
      }
      console.log(JSON.stringify(result));
    `);
    const operator = {
      HandoffQueues: 'provided',
      IdempotencyClaims: 'provided',
      IdempotencyConsoleModule: 'a module',
    };
    const observability = {
      HandoffMetrics: 'provided',
      IdempotencyHealthIndicator: 'provided',
      IdempotencyMetrics: 'provided',
    };
    expect(provided).toEqual({
      'esm operator/index.js': operator,
      'esm observability/index.js': observability,
      'cjs operator/index.js': operator,
      'cjs observability/index.js': observability,
    });
  });

  it('export isIdempotencyError from both entry points', () => {
    const exported = inNode(`
      import { createRequire } from 'node:module';
      import 'reflect-metadata';
      const require = createRequire(import.meta.url);
      const esm = await import('./dist/lib/index.js');
      const cjs = require('./dist/cjs/index.js');
      console.log(JSON.stringify([typeof esm.isIdempotencyError, typeof cjs.isIdempotencyError]));
    `);
    expect(exported).toEqual(['function', 'function']);
  });
});

/** The error classes MAKE_ERRORS builds. */
const ERROR_CLASSES = [
  'InvalidIdempotencyKeyError',
  'EventInFlightError',
  'IdempotencyUnavailableError',
  'TransactionAbortedError',
];
