import { setTimeout as sleep } from 'node:timers/promises';
import {
  deliveryOutcome,
  describeSettled,
  type DeliveryOutcome,
  type SettledDelivery,
} from './delivery-outcome.js';
import { ExactlyOnceError } from './exactly-once.error.js';

/** What `expectOneEffect` and `expectCrashRecovery` both take: how to deliver, what to count, when to give up. */
export interface EffectCheckOptions {
  /**
   * Delivers the event under test once, as its sender would: the same event on every call (same
   * id, same body; signed anew if the signature carries a timestamp). Return the answer or throw
   * as your call does: a supertest request, `fetch`, `lastValueFrom(client.send(...))`, a method
   * call. How the answer is judged is `outcome`'s business.
   */
  deliver: () => unknown;
  /**
   * How many times the event's effect has happened, read from where it lands: rows in your
   * table, calls your downstream stand-in received. Must resolve a number (wrap a pg `count(*)`,
   * which is text, in `Number()`).
   */
  effect: () => number | PromiseLike<number>;
  /** Judges each delivery: delivered, retry later, or failed. @default deliveryOutcome */
  outcome?: (settled: SettledDelivery) => DeliveryOutcome;
  /** Deliveries of one copy, the first included, before a copy still told "retry" fails the check. @default 20 */
  maxAttempts?: number;
  /** Longest one copy may take to be delivered, its retries and their waits included, ms. @default 15000 */
  settleWithinMs?: number;
}

/** @default values of EffectCheckOptions. */
export const SETTLE_DEFAULTS = { maxAttempts: 20, settleWithinMs: 15_000 } as const;

/** First wait before a copy told "retry" is delivered again; it doubles up to RETRY_DELAY_MAX_MS. */
const RETRY_DELAY_MS = 20;
/** A duplicate waits for the first delivery's work: short waits, since that work is a test's. */
const RETRY_DELAY_MAX_MS = 500;

/** One delivery, awaited within `withinMs`; a call that never answers is reported, not waited on forever. */
export async function deliverOnce(
  options: EffectCheckOptions,
  withinMs: number,
  helper: string,
  step: string,
): Promise<{ settled: SettledDelivery; outcome: DeliveryOutcome }> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const hung = new Promise<never>((_, fail) => {
    timer = setTimeout(
      () =>
        fail(
          new ExactlyOnceError(`${helper}: ${step}: the delivery did not answer within ${withinMs} ms`, step),
        ),
      Math.max(withinMs, 1),
    );
  });
  try {
    const call = Promise.resolve().then(() => options.deliver());
    const settled = await Promise.race([
      call.then(
        (value): SettledDelivery => ({ resolved: true, value }),
        (error: unknown): SettledDelivery => ({ resolved: false, error }),
      ),
      hung,
    ]);
    return { settled, outcome: (options.outcome ?? deliveryOutcome)(settled) };
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Delivers until the answer is "delivered", redelivering after each "retry" (a duplicate of a
 * delivery still running, a database hiccup) as a sender would, bounded by `maxAttempts` and
 * `settleWithinMs`. A "failed" answer fails the check at once: a test must not hide a handler
 * that throws behind retries.
 */
export async function settle(options: EffectCheckOptions, helper: string, step: string): Promise<void> {
  const maxAttempts = options.maxAttempts ?? SETTLE_DEFAULTS.maxAttempts;
  const withinMs = options.settleWithinMs ?? SETTLE_DEFAULTS.settleWithinMs;
  const deadline = Date.now() + withinMs;
  for (let attempt = 1; ; attempt++) {
    const { settled, outcome } = await deliverOnce(options, deadline - Date.now(), helper, step);
    if (outcome === 'delivered') return;
    const answer = describeSettled(settled);
    if (outcome === 'failed') {
      throw new ExactlyOnceError(`${helper}: ${step}: delivery ${attempt} failed: it was ${answer}`, step);
    }
    const wait = Math.min(RETRY_DELAY_MS * 2 ** (attempt - 1), RETRY_DELAY_MAX_MS);
    if (attempt >= maxAttempts || Date.now() + wait >= deadline) {
      throw new ExactlyOnceError(
        `${helper}: ${step}: still told to retry after ${attempt} deliveries in ${withinMs - (deadline - Date.now())} ms ` +
          `(maxAttempts ${maxAttempts}, settleWithinMs ${withinMs}); the last was ${answer}`,
        step,
      );
    }
    await sleep(wait);
  }
}

/** `effect()`, checked to be a count. */
export async function countEffect(options: EffectCheckOptions, helper: string): Promise<number> {
  const counted: unknown = await options.effect();
  if (typeof counted !== 'number' || !Number.isFinite(counted)) {
    throw new TypeError(
      `${helper}: effect() must resolve a number, got ${typeof counted} ${String(counted)}` +
        (typeof counted === 'string' ? ' (pg returns count(*) as text: wrap it in Number())' : ''),
    );
  }
  return counted;
}

/** Refuses a bound that is not a positive whole number, naming it. */
export function checkPositiveInteger(helper: string, name: string, value: number | undefined): void {
  if (value !== undefined && (!Number.isInteger(value) || value < 1)) {
    throw new TypeError(`${helper}: ${name} must be a whole number of at least 1, got ${String(value)}`);
  }
}
