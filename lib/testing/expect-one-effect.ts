import { ExactlyOnceError } from './exactly-once.error.js';
import { checkPositiveInteger, countEffect, settle, type EffectCheckOptions } from './settle-delivery.js';

/** Options of `expectOneEffect`. */
export interface OneEffectOptions extends EffectCheckOptions {
  /**
   * Copies of the first delivery sent at once, racing for the claim (1: a single first
   * delivery). Each copy told "retry" (409 while another holds the event) is redelivered until
   * it is delivered. @default 5
   */
  concurrent?: number;
}

const HELPER = 'expectOneEffect';

/**
 * The seed's first test, for your handler: one event, delivered several times, has one effect.
 * The event must not have been delivered before (use a fresh id per test). Two steps, with
 * `await effect() === 1` checked after each:
 *
 * 1. `concurrent` copies of the first delivery at once: they race for the claim, and all but one
 *    must find it taken (in transaction mode they wait for the first and are replayed; in
 *    external mode they are told 409 and redelivered until replayed);
 * 2. one more delivery, after all of them were answered: the sender's retry, in sequence. This is
 *    the step that catches a key that is not the same on every delivery (taken from a header the
 *    sender regenerates, a timestamp, a UUID made per request), the most common mistake.
 *
 * Rejects with an `ExactlyOnceError` naming the step, what `effect()` counted, and the likely
 * cause; or when a delivery fails outright (a 500, a thrown error) or is still told to retry
 * after `maxAttempts` deliveries or `settleWithinMs`. Framework-agnostic: await it in any test.
 *
 * ```ts
 * await expectOneEffect({
 *   deliver: () => request(app.getHttpServer()).post('/webhooks/orders').send(event),
 *   effect: async () => Number((await db.query('SELECT count(*) FROM orders WHERE event_id = $1', [event.id]))[0].count),
 * });
 * ```
 */
export async function expectOneEffect(options: OneEffectOptions): Promise<void> {
  const concurrent = options.concurrent ?? 5;
  checkPositiveInteger(HELPER, 'concurrent', concurrent);
  checkPositiveInteger(HELPER, 'maxAttempts', options.maxAttempts);
  checkPositiveInteger(HELPER, 'settleWithinMs', options.settleWithinMs);
  const before = await countEffect(options, HELPER);
  if (before !== 0) {
    throw new ExactlyOnceError(
      `${HELPER}: before the first delivery the effect already counted ${before}: deliver an event ` +
        'this test has not delivered before (a fresh id), and count only its effect',
      'before the first delivery',
      before,
    );
  }

  const first = concurrent === 1 ? 'the first delivery' : `${concurrent} concurrent first deliveries`;
  // allSettled: every copy is answered before the count, so none is still running behind it.
  const copies = await Promise.allSettled(
    Array.from({ length: concurrent }, () => settle(options, HELPER, first)),
  );
  const broken = copies.find((copy) => copy.status === 'rejected');
  if (broken) throw (broken as PromiseRejectedResult).reason;
  await expectOnce(options, first, (counted) =>
    counted === 0
      ? 'Every delivery was answered as a success but nothing happened: does effect() count what the ' +
        'handler writes, where it writes it?'
      : concurrent === 1
        ? 'One delivery did the work more than once.'
        : 'Copies that ran at once each did the work: their keys differ (the key comes from something ' +
          'made per request, not from the event), the handler is not claimed at all, or its own ' +
          'dedupe is a read-then-write race outside the claim.',
  );

  const again = 'the redelivery in sequence';
  await settle(options, HELPER, again);
  await expectOnce(options, again, (counted) =>
    counted === 0
      ? 'The effect disappeared after a redelivery.'
      : 'The redelivery did the work again: its key is not the one the first delivery claimed (taken from ' +
        'something made per request or per attempt: a UUID, a timestamp, a header the sender regenerates), ' +
        'or the handler is not claimed at all.',
  );
}

async function expectOnce(
  options: EffectCheckOptions,
  step: string,
  cause: (counted: number) => string,
): Promise<void> {
  const counted = await countEffect(options, HELPER);
  if (counted === 1) return;
  throw new ExactlyOnceError(
    `${HELPER}: after ${step}, the effect counted ${counted}, expected 1. ${cause(counted)}`,
    step,
    counted,
  );
}
