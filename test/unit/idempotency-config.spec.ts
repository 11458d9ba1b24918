import { describe, expect, it } from '@jest/globals';
import { resolveIdempotencyConfig } from '../../lib/idempotency.config.js';
import { DEFAULTS } from '../../lib/idempotency.constants.js';

describe('resolveIdempotencyConfig', () => {
  it('fills every default when no options are given', () => {
    expect(resolveIdempotencyConfig()).toEqual({
      ...DEFAULTS,
      reporter: true,
      prometheus: true,
      preparedStatements: 'auto',
      strictTransactions: false,
      // Jest runs with NODE_ENV=test: the unstable-key detector is on outside production.
      detectUnstableKeys: true,
      table: 'processed_events',
    });
    expect(resolveIdempotencyConfig({})).toEqual(resolveIdempotencyConfig());
  });

  it('turns the unstable-key detector off by default in production, and checks the new options', () => {
    const environment = process.env.NODE_ENV;
    process.env.NODE_ENV = 'production';
    try {
      expect(resolveIdempotencyConfig().detectUnstableKeys).toBe(false);
      expect(resolveIdempotencyConfig({ detectUnstableKeys: true }).detectUnstableKeys).toBe(true);
    } finally {
      process.env.NODE_ENV = environment;
    }
    expect(() => resolveIdempotencyConfig({ detectUnstableKeys: 'yes' as never })).toThrow(
      'IdempotencyModule option detectUnstableKeys must be true or false, got yes',
    );
    expect(() => resolveIdempotencyConfig({ maxStoredResponseBytes: 1.5 })).toThrow(
      'IdempotencyModule option maxStoredResponseBytes must be a whole number',
    );
    expect(() => resolveIdempotencyConfig({ unstableKeyWindowMs: 0 })).toThrow(
      'IdempotencyModule option unstableKeyWindowMs must be a positive number, got 0',
    );
  });

  it('documents the defaults the README promises', () => {
    expect(resolveIdempotencyConfig()).toMatchObject({
      leaseMs: 300_000,
      concurrentDuplicateWaitMs: 5_000,
      retryAfterSeconds: 30,
      maxKeyLength: 255,
      slowTransactionWarnMs: 10_000,
      inFlightStatus: 409,
    });
  });

  it('keeps given options and lets undefined ones fall back to the default', () => {
    // forRootAsync factories often spread optional env values that are undefined.
    const config = resolveIdempotencyConfig({
      leaseMs: 2_000,
      retryAfterSeconds: undefined,
      inFlightStatus: 503,
    });
    expect(config.leaseMs).toBe(2_000);
    expect(config.retryAfterSeconds).toBe(30);
    expect(config.inFlightStatus).toBe(503);
  });

  it('accepts a zero concurrentDuplicateWaitMs (answer duplicates at once)', () => {
    expect(resolveIdempotencyConfig({ concurrentDuplicateWaitMs: 0 }).concurrentDuplicateWaitMs).toBe(0);
  });

  const positive = [
    'leaseMs',
    'retryAfterSeconds',
    'maxKeyLength',
    'reportEveryMs',
    'maxAttempts',
    'retentionDays',
    'retentionBatchSize',
    'slowTransactionWarnMs',
  ] as const;

  describe.each(positive)('%s', (name) => {
    it.each([0, -1, Number.NaN, 'abc' as unknown as number, '10' as unknown as number])(
      'rejects %p, naming the option',
      (value) => {
        expect(() => resolveIdempotencyConfig({ [name]: value })).toThrow(
          `IdempotencyModule option ${name} must be a positive number, got ${String(value)}`,
        );
      },
    );
  });

  it.each([-1, Number.NaN, '10' as unknown as number])('rejects concurrentDuplicateWaitMs %p', (value) => {
    expect(() => resolveIdempotencyConfig({ concurrentDuplicateWaitMs: value })).toThrow(
      `IdempotencyModule option concurrentDuplicateWaitMs must be zero or more, got ${value}`,
    );
  });

  it.each(['retryAfterSeconds', 'retentionBatchSize', 'retentionMaxBatches'] as const)(
    'rejects a %s that is not a whole number',
    (name) => {
      expect(() => resolveIdempotencyConfig({ [name]: 0.5 })).toThrow(
        `IdempotencyModule option ${name} must be a whole number (at most 2^53 - 1), got 0.5`,
      );
    },
  );

  it.each(['yes', 1, null])('rejects strictTransactions %p', (value) => {
    expect(() => resolveIdempotencyConfig({ strictTransactions: value as unknown as boolean })).toThrow(
      `IdempotencyModule option strictTransactions must be true or false, got ${value}`,
    );
  });

  it.each([418, 200, 500])('rejects inFlightStatus %p', (value) => {
    expect(() => resolveIdempotencyConfig({ inFlightStatus: value as 409 })).toThrow(
      `IdempotencyModule option inFlightStatus must be 409 or 503, got ${value}`,
    );
  });

  it.each([
    ['leaseMss', 'leaseMs'],
    ['retentiondays', 'retentionDays'],
    ['preparedStatement', 'preparedStatements'],
    ['concurrentDuplicateWait', 'concurrentDuplicateWaitMs'],
  ])('refuses the unknown option %p, naming the closest known one', (name, suggestion) => {
    expect(() => resolveIdempotencyConfig({ [name]: 1 } as never)).toThrow(
      `IdempotencyModule has no option ${name}; did you mean ${suggestion}?`,
    );
  });

  it('refuses an unknown option that resembles nothing without a suggestion', () => {
    expect(() => resolveIdempotencyConfig({ redisUrl: 'redis://x' } as never)).toThrow(
      /^IdempotencyModule has no option redisUrl$/,
    );
  });

  it.each(['leaseMs', 'reportEveryMs', 'slowTransactionWarnMs', 'concurrentDuplicateWaitMs'] as const)(
    'refuses %s beyond the longest timer Node can set (it would fire every millisecond)',
    (name) => {
      expect(() => resolveIdempotencyConfig({ [name]: Number.POSITIVE_INFINITY })).toThrow(
        `IdempotencyModule option ${name} must be at most 2147483647 ms (the longest timer Node can set), got Infinity`,
      );
    },
  );
});
