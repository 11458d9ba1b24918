import { describe, expect, it } from '@jest/globals';
import { resolveClaimSpec } from '../../lib/core/claim-options.js';
import type { IdempotencyClaimOptions } from '../../lib/interfaces/index.js';
import { IDEMPOTENCY_MODES } from '../../lib/strategies/claim-strategies.js';

const WHERE = '@IdempotentWebhook';
const DEFAULT_SCOPE = 'PaymentsController.stripe';

/** Options as a caller without TypeScript (or with a cast) can pass them. */
const loose = (options: Record<string, unknown>) => options as IdempotencyClaimOptions;

/** The TypeError `resolveClaimSpec` throws for `options`, checked for class and exact message. */
function expectRefused(options: IdempotencyClaimOptions, message: string, where = WHERE): void {
  let failure: unknown;
  try {
    resolveClaimSpec(where, options, DEFAULT_SCOPE);
  } catch (error) {
    failure = error;
  }
  expect(failure).toBeInstanceOf(TypeError);
  expect((failure as TypeError).message).toBe(message);
}

describe('resolveClaimSpec', () => {
  it('defaults to transaction mode, the handler as scope and the scope as source, no lease options', () => {
    expect(resolveClaimSpec(WHERE, {}, DEFAULT_SCOPE)).toEqual({
      scope: DEFAULT_SCOPE,
      source: DEFAULT_SCOPE,
      mode: 'transaction',
      leaseMs: undefined,
      heartbeat: false,
      propagation: 'required',
    });
  });

  it('keeps a given scope and source; the source defaults to the given scope', () => {
    expect(resolveClaimSpec(WHERE, { scope: 'stripe-v2', source: 'stripe' }, DEFAULT_SCOPE)).toMatchObject({
      scope: 'stripe-v2',
      source: 'stripe',
    });
    expect(resolveClaimSpec(WHERE, { scope: 'stripe-v2' }, DEFAULT_SCOPE)).toMatchObject({
      scope: 'stripe-v2',
      source: 'stripe-v2',
    });
  });

  it('offers exactly the registered modes', () => {
    expect([...IDEMPOTENCY_MODES].sort()).toEqual(['external', 'transaction']);
  });

  it.each([
    ["mode: 'external'", { mode: 'external' }, 'external'],
    ['external: true (the alias)', { external: true }, 'external'],
    ["both, agreeing: mode: 'external', external: true", { mode: 'external', external: true }, 'external'],
    ["mode: 'transaction'", { mode: 'transaction' }, 'transaction'],
    ['external: false', { external: false }, 'transaction'],
    [
      "both, agreeing: mode: 'transaction', external: false",
      { mode: 'transaction', external: false },
      'transaction',
    ],
  ] as const)('resolves %s to %s mode', (_what, options, mode) => {
    expect(resolveClaimSpec(WHERE, options, DEFAULT_SCOPE).mode).toBe(mode);
  });

  it.each([
    [{ mode: 'external', external: false }, "external: false contradicts mode: 'external'; give one of them"],
    [
      { mode: 'transaction', external: true },
      "external: true contradicts mode: 'transaction'; give one of them",
    ],
  ] as const)('refuses contradicting mode and external (%o)', (options, detail) => {
    expectRefused(options, `${WHERE} ${detail}`);
  });

  it.each([
    ['an unknown name', 'lease', 'lease'],
    ['a near miss in case', 'External', 'External'],
    ['a number', 1, '1'],
    ['an empty string', '', ''],
  ])('refuses mode as %s, listing the modes', (_what, mode, shown) => {
    expectRefused(loose({ mode }), `${WHERE} mode must be one of 'transaction', 'external', got ${shown}`);
  });

  it.each([
    ['a string', 'yes'],
    ['a number', 1],
    ['null', null],
  ])('refuses external as %s', (_what, external) => {
    expectRefused(loose({ external }), `${WHERE} external must be a boolean`);
  });

  it.each([
    ['a name in the wrong case', 'requiresnew', 'requiresnew'],
    ['a mode nestjs-cls has and claims do not', 'nested', 'nested'],
    ['a number', 1, '1'],
    ['null', null, 'null'],
  ])('refuses propagation as %s, listing the values', (_what, propagation, shown) => {
    expectRefused(
      loose({ propagation }),
      `${WHERE} propagation must be one of 'required', 'requiresNew', 'mandatory', 'never', got ${shown}`,
    );
  });

  it.each(['required', 'requiresNew', 'mandatory', 'never'] as const)(
    'keeps propagation %s',
    (propagation) => {
      expect(resolveClaimSpec(WHERE, { propagation }, DEFAULT_SCOPE).propagation).toBe(propagation);
    },
  );

  it.each([
    ['an empty scope', { scope: '' }, 'scope must be a non-empty string'],
    ['a scope that is not a string', { scope: 42 }, 'scope must be a non-empty string'],
    ['an empty source', { source: '' }, 'source must be a non-empty string'],
    ['a source that is not a string', { source: { name: 'stripe' } }, 'source must be a non-empty string'],
  ])('refuses %s', (_what, options, detail) => {
    expectRefused(loose(options), `${WHERE} ${detail}`);
  });

  it('keeps leaseMs and heartbeat in external mode', () => {
    expect(
      resolveClaimSpec(WHERE, { mode: 'external', leaseMs: 2_000, heartbeat: true }, DEFAULT_SCOPE),
    ).toEqual({
      scope: DEFAULT_SCOPE,
      source: DEFAULT_SCOPE,
      mode: 'external',
      leaseMs: 2_000,
      heartbeat: true,
      propagation: 'required',
    });
    // A fraction of a millisecond is a valid lease: the SQL multiplies a double precision.
    expect(resolveClaimSpec(WHERE, { external: true, leaseMs: 0.5 }, DEFAULT_SCOPE).leaseMs).toBe(0.5);
    expect(resolveClaimSpec(WHERE, { external: true, heartbeat: false }, DEFAULT_SCOPE).heartbeat).toBe(
      false,
    );
  });

  it.each([
    ['zero', 0, '0'],
    ['negative', -1_000, '-1000'],
    ['NaN', Number.NaN, 'NaN'],
    ['a numeric string (an unparsed environment variable)', '5000', '5000'],
    ['null', null, 'null'],
  ])('refuses leaseMs %s', (_what, leaseMs, shown) => {
    expectRefused(
      loose({ mode: 'external', leaseMs }),
      `${WHERE} leaseMs must be a positive number of milliseconds, got ${shown}`,
    );
  });

  it.each([
    ['Infinity', Number.POSITIVE_INFINITY, 'Infinity'],
    ['one past the longest timer Node can set', 2 ** 31, '2147483648'],
  ])('refuses leaseMs %s, which would fire the heartbeat every millisecond', (_what, leaseMs, shown) => {
    expectRefused(
      loose({ mode: 'external', leaseMs }),
      `${WHERE} leaseMs must be at most 2147483647 ms (about 24.8 days, the longest timer Node can set), got ${shown}`,
    );
  });

  it('accepts the longest lease a timer can hold', () => {
    expect(resolveClaimSpec(WHERE, { mode: 'external', leaseMs: 2 ** 31 - 1 }, 'Scope.method').leaseMs).toBe(
      2 ** 31 - 1,
    );
  });

  it('refuses a heartbeat that is not a boolean', () => {
    expectRefused(loose({ mode: 'external', heartbeat: 'true' }), `${WHERE} heartbeat must be a boolean`);
  });

  it.each([
    ['leaseMs', { leaseMs: 2_000 }],
    ['heartbeat: true', { heartbeat: true }],
    ['both', { leaseMs: 2_000, heartbeat: true }],
    ["leaseMs with mode: 'transaction'", { mode: 'transaction', leaseMs: 2_000 }],
    ['heartbeat with external: false', { external: false, heartbeat: true }],
  ] as const)('refuses %s in transaction mode: a transaction has no lease', (_what, options) => {
    expectRefused(
      options,
      `${WHERE} leaseMs and heartbeat belong to external mode; add mode: 'external' or remove them`,
    );
  });

  it('accepts heartbeat: false in transaction mode (it asks for nothing)', () => {
    expect(resolveClaimSpec(WHERE, { heartbeat: false }, DEFAULT_SCOPE)).toMatchObject({
      mode: 'transaction',
      heartbeat: false,
    });
  });

  it.each(['@IdempotentWebhook', '@Idempotent', 'IdempotencyService.run'])(
    'names %s, the caller, at the start of every message',
    (where) => {
      const cases: Record<string, unknown>[] = [
        { scope: '' },
        { mode: 'lease' },
        { mode: 'external', external: false },
        { mode: 'external', leaseMs: 0 },
        { leaseMs: 1_000 },
        { external: 'yes' },
      ];
      for (const options of cases) {
        let failure: unknown;
        try {
          resolveClaimSpec(where, loose(options), DEFAULT_SCOPE);
        } catch (error) {
          failure = error;
        }
        expect(failure).toBeInstanceOf(TypeError);
        expect((failure as Error).message.startsWith(`${where} `)).toBe(true);
      }
    },
  );

  it('refuses a missing scope when there is no default to fall back on (IdempotencyService.run)', () => {
    let failure: unknown;
    try {
      resolveClaimSpec('IdempotencyService.run', {}, undefined as unknown as string);
    } catch (error) {
      failure = error;
    }
    expect((failure as Error).message).toBe('IdempotencyService.run scope must be a non-empty string');
  });

  it.each(['scope', 'source'] as const)('refuses a %s longer than its varchar(255) column', (option) => {
    const long = 'é'.repeat(256);
    expectRefused(
      { ...(option === 'source' ? { scope: 'Scope.method' } : {}), [option]: long },
      `${WHERE} ${option} must be at most 255 characters (got 256)`,
    );
    expect(resolveClaimSpec(WHERE, { [option]: 'é'.repeat(255) }, 'Scope.method')[option]).toHaveLength(255);
  });
});
