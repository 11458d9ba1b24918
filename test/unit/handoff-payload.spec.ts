import { describe, expect, it } from '@jest/globals';
import { handoffPayload, jobKeyOf, readHandoffPayload } from '../../lib/transports/queue/handoff-payload.js';

const EVENT = { key: 'evt_1', scope: 'Webhooks.stripe', source: 'stripe' };
const JOB_ID = '5f0c6f0e-6d6b-4b8e-9d62-1d0f3c6c2c55';

describe("a handoff job's payload and its key", () => {
  it("carries the job's key beside the event: the one the worker claims", () => {
    const payload = handoffPayload(EVENT, 'ship:order-7', { orderId: 7 });
    expect(payload).toEqual({ event: EVENT, key: 'ship:order-7', data: { orderId: 7 } });
    expect(jobKeyOf(readHandoffPayload(payload)!, JOB_ID)).toBe('ship:order-7');
  });

  it("falls back to the job's id for a job an earlier version wrote without a key", () => {
    const legacy = { event: EVENT, data: null };
    expect(jobKeyOf(readHandoffPayload(legacy)!, JOB_ID)).toBe(JOB_ID);
  });

  it.each([
    ['an empty key', ''],
    ['a number', 42],
    ['null', null],
    ['an object', { id: 1 }],
  ])(
    'refuses a payload whose key is %s: the worker fails the job, naming why, instead of guessing',
    (_what, key) => {
      expect(readHandoffPayload({ event: EVENT, key, data: null })).toBeNull();
    },
  );

  it('refuses data that no enqueue() wrote', () => {
    expect(readHandoffPayload({ data: 1 })).toBeNull();
    expect(readHandoffPayload(null)).toBeNull();
    expect(readHandoffPayload({ event: { ...EVENT, key: '' }, key: 'k', data: null })).toBeNull();
  });
});
