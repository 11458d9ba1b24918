import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { InProcessWaiters, type FirstOutcome } from '../../lib/strategies/in-process-waiters.js';

/** The claim id the transaction strategy builds: scope, NUL, key. */
const ID = 'FixtureController.order\u0000evt_1';

/** A promise's settled value so far, without awaiting it: lets a test see "still pending". */
function track<T>(promise: Promise<T>): { value: T | 'pending' } {
  const state: { value: T | 'pending' } = { value: 'pending' };
  void promise.then((value) => (state.value = value));
  return state;
}

/** Lets resolved promises run their callbacks (fake timers do not fake microtasks). */
const settle = () => Promise.resolve().then(() => undefined);

describe('InProcessWaiters', () => {
  let waiters: InProcessWaiters;

  beforeEach(() => {
    jest.useFakeTimers();
    waiters = new InProcessWaiters();
  });

  afterEach(() => {
    jest.useRealTimers();
  });

  it('knows which deliveries run between begin() and end()', () => {
    expect(waiters.has(ID)).toBe(false);
    waiters.begin(ID);
    expect(waiters.has(ID)).toBe(true);
    expect(waiters.has('FixtureController.order\u0000evt_2')).toBe(false);
    waiters.end(ID, 'committed');
    expect(waiters.has(ID)).toBe(false);
  });

  it.each<FirstOutcome>(['committed', 'not_committed'])(
    "tells every waiter '%s' when the first delivery ends, and leaves no timer behind",
    async (outcome) => {
      waiters.begin(ID);
      const waiting = [waiters.wait(ID, 5_000), waiters.wait(ID, 5_000), waiters.wait(ID, 60_000)].map(track);
      expect(jest.getTimerCount()).toBe(3);
      await settle();
      expect(waiting.map((state) => state.value)).toEqual(['pending', 'pending', 'pending']);

      waiters.end(ID, outcome);
      await settle();
      expect(waiting.map((state) => state.value)).toEqual([outcome, outcome, outcome]);
      expect(jest.getTimerCount()).toBe(0);
      expect(waiters.has(ID)).toBe(false);
    },
  );

  it('times out at its bound and not a millisecond before', async () => {
    waiters.begin(ID);
    const waiting = track(waiters.wait(ID, 1_000));
    jest.advanceTimersByTime(999);
    await settle();
    expect(waiting.value).toBe('pending');
    jest.advanceTimersByTime(1);
    await settle();
    expect(waiting.value).toBe('timeout');
    // The first delivery ending later does not change a waiter that already gave up.
    waiters.end(ID, 'committed');
    await settle();
    expect(waiting.value).toBe('timeout');
  });

  it('times each waiter out on its own bound; the ones still waiting learn the outcome', async () => {
    waiters.begin(ID);
    const short = track(waiters.wait(ID, 100));
    const long = track(waiters.wait(ID, 10_000));
    jest.advanceTimersByTime(100);
    await settle();
    expect([short.value, long.value]).toEqual(['timeout', 'pending']);
    expect(jest.getTimerCount()).toBe(1);
    waiters.end(ID, 'not_committed');
    await settle();
    expect([short.value, long.value]).toEqual(['timeout', 'not_committed']);
    expect(jest.getTimerCount()).toBe(0);
  });

  it.each([0, -1, -250.5])('answers timeout at once, without a timer, when ms is %d', async (ms) => {
    waiters.begin(ID);
    const waiting = track(waiters.wait(ID, ms));
    expect(jest.getTimerCount()).toBe(0);
    await settle();
    expect(waiting.value).toBe('timeout');
    // Still running: the caller's bound is spent, not the first delivery.
    expect(waiters.has(ID)).toBe(true);
  });

  it('answers not_committed at once when nothing runs for the id, even with time to wait', async () => {
    const waiting = track(waiters.wait(ID, 5_000));
    expect(jest.getTimerCount()).toBe(0);
    await settle();
    expect(waiting.value).toBe('not_committed');
    // Also after a delivery of it has ended.
    waiters.begin(ID);
    waiters.end(ID, 'committed');
    await expect(waiters.wait(ID, 5_000)).resolves.toBe('not_committed');
    await expect(waiters.wait(ID, 0)).resolves.toBe('not_committed');
  });

  it('keeps ids apart: ending one wakes only its own waiters', async () => {
    const other = 'FixtureController.order\u0000evt_2';
    waiters.begin(ID);
    waiters.begin(other);
    const mine = track(waiters.wait(ID, 5_000));
    const theirs = track(waiters.wait(other, 5_000));
    waiters.end(other, 'committed');
    await settle();
    expect([mine.value, theirs.value]).toEqual(['pending', 'committed']);
    expect(waiters.has(ID)).toBe(true);
    waiters.end(ID, 'not_committed');
    await settle();
    expect([mine.value, theirs.value]).toEqual(['not_committed', 'committed']);
  });

  it('lets a waiter woken by not_committed begin the next delivery, which the others then wait on', async () => {
    // What the transaction strategy does: the first to wake claims in its place.
    waiters.begin(ID);
    const first = waiters.wait(ID, 5_000);
    const second = track(waiters.wait(ID, 5_000));
    const takeover = first.then((outcome) => {
      if (outcome === 'not_committed' && !waiters.has(ID)) waiters.begin(ID);
      return outcome;
    });
    waiters.end(ID, 'not_committed');
    await expect(takeover).resolves.toBe('not_committed');
    expect(waiters.has(ID)).toBe(true);
    expect(second.value).toBe('not_committed');
    const third = track(waiters.wait(ID, 5_000));
    waiters.end(ID, 'committed');
    await settle();
    expect(third.value).toBe('committed');
  });

  it('ends an id nobody began, or ends it twice, without effect', () => {
    expect(() => waiters.end('never-begun', 'committed')).not.toThrow();
    waiters.begin(ID);
    waiters.end(ID, 'committed');
    expect(() => waiters.end(ID, 'not_committed')).not.toThrow();
    expect(waiters.has(ID)).toBe(false);
  });

  it('forgets each waiter that times out: 10,000 timed-out waits leave no callback while the first still runs', async () => {
    waiters.begin(ID);
    const waits = Array.from({ length: 10_000 }, () => waiters.wait(ID, 100));
    expect(waiters.waitingFor(ID)).toBe(10_000);

    jest.advanceTimersByTime(100);
    expect(await Promise.all(waits)).toEqual(Array(10_000).fill('timeout'));
    // The first delivery has not ended, and holds nothing for the duplicates that gave up.
    expect(waiters.has(ID)).toBe(true);
    expect(waiters.waitingFor(ID)).toBe(0);
    expect(jest.getTimerCount()).toBe(0);

    // A duplicate arriving after that still learns how the first ended.
    const late = track(waiters.wait(ID, 5_000));
    expect(waiters.waitingFor(ID)).toBe(1);
    waiters.end(ID, 'committed');
    await settle();
    expect(late.value).toBe('committed');
    expect(waiters.waitingFor(ID)).toBe(0);
  });

  it('drops only the waiters whose bound ran out; the others stay and are told the outcome', async () => {
    waiters.begin(ID);
    const short = [waiters.wait(ID, 100), waiters.wait(ID, 100), waiters.wait(ID, 100)].map(track);
    const long = [waiters.wait(ID, 10_000), waiters.wait(ID, 10_000)].map(track);
    expect(waiters.waitingFor(ID)).toBe(5);

    jest.advanceTimersByTime(100);
    await settle();
    expect(short.map((state) => state.value)).toEqual(['timeout', 'timeout', 'timeout']);
    expect(waiters.waitingFor(ID)).toBe(2);

    waiters.end(ID, 'not_committed');
    await settle();
    expect(long.map((state) => state.value)).toEqual(['not_committed', 'not_committed']);
    expect(waiters.waitingFor(ID)).toBe(0);
  });
});

/**
 * The same clean-up seen from outside, whatever the class keeps: a duplicate's wait, once timed
 * out and let go by its caller, can be garbage collected while the first delivery still runs. Real
 * timers, as the collector runs between macrotasks.
 */
describe('InProcessWaiters and the garbage collector', () => {
  /** V8's collector, exposed at run time (Jest's Node was not started with --expose-gc). */
  function collector(): () => void {
    setFlagsFromString('--expose-gc');
    return runInNewContext('gc') as () => void;
  }
  const macrotask = () => new Promise<void>((resolve) => setImmediate(resolve));

  it('lets 1,000 timed-out waits be collected while the first delivery still runs', async () => {
    const gc = collector();
    const waiters = new InProcessWaiters();
    waiters.begin(ID);
    const refs: WeakRef<object>[] = [];
    const outcomes: string[] = [];
    // The waits are made, awaited and dropped inside this function: only the WeakRefs outlive it.
    await (async () => {
      const waits = Array.from({ length: 1_000 }, () => waiters.wait(ID, 20));
      for (const wait of waits) refs.push(new WeakRef(wait));
      outcomes.push(...(await Promise.all(waits)));
    })();
    expect(outcomes).toEqual(Array(1_000).fill('timeout'));
    expect(waiters.has(ID)).toBe(true);

    // A WeakRef's target is kept until the job that made or read it ends: collect after that.
    for (let round = 0; round < 3 && refs.some((ref) => ref.deref() !== undefined); round++) {
      await macrotask();
      gc();
    }
    expect(refs.filter((ref) => ref.deref() !== undefined)).toHaveLength(0);
    waiters.end(ID, 'committed');
  });
});
