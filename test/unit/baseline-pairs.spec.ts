import { describe, expect, it } from '@jest/globals';
import { baselinePairs, skippedLine } from '../../bench/baseline-pairs.js';
import { BASELINE_PAIRS, VARIANTS } from '../../bench/variants.js';

/** The routes of b4753f6's bench server (its bench/variants.ts): before typeorm-tx, ordering and the request mode. */
const AT_B4753F6 = [
  'none',
  'raw-naive',
  'raw-tx',
  'raw-tx-intercepted',
  'lib-tx',
  'raw-lease',
  'lib-external',
];

describe('bench --baseline: the pairs a baseline runs', () => {
  it('runs every pair on a baseline that has every route', () => {
    expect(baselinePairs(VARIANTS)).toEqual({ measured: [...BASELINE_PAIRS], skipped: [] });
  });

  it('skips, naming them, the pairs whose routes an older baseline lacks (b4753f6: no request mode)', () => {
    const { measured, skipped } = baselinePairs(AT_B4753F6);
    expect(measured.map((pair) => pair.name)).toEqual(['lib-tx/raw-tx', 'lib-external/raw-lease']);
    expect(skipped).toEqual([{ pair: 'lib-request/raw-request', missing: ['lib-request', 'raw-request'] }]);
    expect(skippedLine('b4753f6', skipped)).toBe(
      'b4753f6 has no lib-request, raw-request route: lib-request/raw-request runs on the current server alone',
    );
  });

  it('skips a pair when one side alone is missing, and names only that side', () => {
    const { measured, skipped } = baselinePairs(VARIANTS.filter((variant) => variant !== 'raw-lease'));
    expect(measured.map((pair) => pair.name)).toEqual(['lib-tx/raw-tx', 'lib-request/raw-request']);
    expect(skipped).toEqual([{ pair: 'lib-external/raw-lease', missing: ['raw-lease'] }]);
  });

  it('measures every pair when the baseline does not say which routes it has (as before)', () => {
    expect(baselinePairs(undefined)).toEqual({ measured: [...BASELINE_PAIRS], skipped: [] });
    expect(skippedLine('b4753f6', [])).toBeUndefined();
  });
});
