import type { DataSource } from 'typeorm';
import { armCrash } from './crash-before-commit.js';
import { describeSettled } from './delivery-outcome.js';
import { ExactlyOnceError } from './exactly-once.error.js';
import { expireLease } from './expire-lease.js';
import {
  checkPositiveInteger,
  countEffect,
  deliverOnce,
  settle,
  SETTLE_DEFAULTS,
  type EffectCheckOptions,
} from './settle-delivery.js';

/** Options of `expectCrashRecovery`. */
export interface CrashRecoveryOptions extends EffectCheckOptions {
  /** The handler's claim scope (the decorator's `scope`, by default `Class.method`). Required with `external`. @default any scope */
  scope?: string;
  /** The event's key, as the handler's key extractor returns it. Required with `external`. @default any key */
  key?: string;
  /** The handler is external mode (`external: true`): its work is outside the database. @default false */
  external?: boolean;
  /** The app's DataSource, to end the crashed worker's lease (`expireLease`). Required with `external`. @default undefined */
  dataSource?: DataSource;
  /** Where the claims table is, when the module's `schema` or `table` option moved it. @default the module's defaults */
  table?: { schema?: string; table?: string };
}

const HELPER = 'expectCrashRecovery';

/**
 * The seed's second test, for your handler: a delivery that dies between its work and its
 * COMMIT, then the sender's redelivery, must leave the effect exactly once. In process, with
 * `crashBeforeCommit()` instead of a kill. The event must not have been delivered before (a fresh
 * id per test). In order:
 *
 * 1. one delivery, crashed before its COMMIT: it must not be answered as a success (the sender
 *    must deliver it again), and it must have reached its COMMIT (else scope, key or the route's
 *    decorator are not what you think);
 * 2. transaction mode: the effect must be absent, rolled back with the claim. A write still there
 *    was made outside the claim's transaction (through an injected repository or the DataSource
 *    rather than the claim's manager): the hole a crash turns into a lost or doubled effect.
 *    External mode: the work ran (the crash came after it); the crashed worker's lease is ended
 *    with `expireLease(dataSource, scope, key)`, as its expiry would after `leaseMs`;
 * 3. the redelivery (retried while told "retry"): the effect must now be exactly 1;
 * 4. one more delivery: it must stay 1 (replayed).
 *
 * In external mode the redelivery runs the work a second time: that is what at-least-once means
 * for work outside the database. The effect is then once only if the downstream dedupes by the
 * key you send it (an `Idempotency-Key` header carrying the event's key, the same on every
 * attempt), and that is exactly what this test proves for your handler: count the effect as the
 * downstream applies it (one per distinct key), not as calls received.
 *
 * Rejects with an `ExactlyOnceError` naming the step, what `effect()` counted and the likely
 * cause. The crash is disarmed before it returns, whatever happens.
 *
 * ```ts
 * await expectCrashRecovery({
 *   deliver: () => request(app.getHttpServer()).post('/webhooks/orders').send(event),
 *   effect: () => countOrders(event.id),
 *   scope: 'OrdersController.handle',
 * });
 * // External mode: the lease of the "dead" worker is ended through the DataSource.
 * await expectCrashRecovery({
 *   deliver: () => request(app.getHttpServer()).post('/webhooks/fulfilment').send(event),
 *   effect: () => new Set(fulfilmentApi.calls.map((call) => call.idempotencyKey)).size,
 *   external: true, scope: 'FulfilmentController.handle', key: event.id, dataSource,
 * });
 * ```
 */
export async function expectCrashRecovery(options: CrashRecoveryOptions): Promise<void> {
  checkPositiveInteger(HELPER, 'maxAttempts', options.maxAttempts);
  checkPositiveInteger(HELPER, 'settleWithinMs', options.settleWithinMs);
  const external = options.external ?? false;
  if (external) {
    const missing = (['dataSource', 'scope', 'key'] as const).filter((name) => options[name] === undefined);
    if (missing.length > 0) {
      // Without them the crashed worker's lease holds for leaseMs, longer than any test waits.
      throw new TypeError(
        `${HELPER}: external mode needs ${missing.join(', ')}, to end the crashed worker's lease (expireLease)`,
      );
    }
  }
  const before = await countEffect(options, HELPER);
  if (before !== 0) {
    throw new ExactlyOnceError(
      `${HELPER}: before the first delivery the effect already counted ${before}: deliver an event ` +
        'this test has not delivered before (a fresh id), and count only its effect',
      'before the first delivery',
      before,
    );
  }

  await crashOnce(options);

  const step = 'the crashed delivery';
  const afterCrash = await countEffect(options, HELPER);
  if (!external && afterCrash !== 0) {
    throw new ExactlyOnceError(
      `${HELPER}: after ${step}, the effect counted ${afterCrash}, expected 0: its transaction rolled back, ` +
        "yet the effect stayed. The handler writes outside the claim's transaction (an injected repository, " +
        'the DataSource or another connection instead of @WebhookTransaction() / IdempotencyContext.manager), ' +
        'so that write commits on its own: a crash before the COMMIT keeps it and loses the claim, and the ' +
        'redelivery does it again. (An external-mode handler does its work before the crash: pass ' +
        'external: true, with dataSource, scope and key.)',
      step,
      afterCrash,
    );
  }
  if (external) {
    if (afterCrash > 1) {
      throw new ExactlyOnceError(
        `${HELPER}: after ${step}, the effect counted ${afterCrash}, expected at most 1 (its work ran once).`,
        step,
        afterCrash,
      );
    }
    const ended = await expireLease(options.dataSource!, options.scope!, options.key!, options.table);
    if (!ended) {
      throw new ExactlyOnceError(
        `${HELPER}: after ${step}, no lease of scope ${JSON.stringify(options.scope)} and key ` +
          `${JSON.stringify(options.key)} was in progress: is the handler external: true, and are scope ` +
          "and key its claim's?",
        step,
      );
    }
  }

  const redelivery = 'the redelivery';
  await settle(options, HELPER, redelivery);
  const recovered = await countEffect(options, HELPER);
  if (recovered !== 1) {
    throw new ExactlyOnceError(
      `${HELPER}: after ${redelivery}, the effect counted ${recovered}, expected 1. ` +
        recoveryCause(recovered, external),
      redelivery,
      recovered,
    );
  }

  const last = 'one more delivery';
  await settle(options, HELPER, last);
  const after = await countEffect(options, HELPER);
  if (after !== 1) {
    throw new ExactlyOnceError(
      `${HELPER}: after ${last}, the effect counted ${after}, expected 1: a delivery of an event already ` +
        'done did the work again. Its key is not the one the earlier deliveries claimed (taken from ' +
        'something made per request or per attempt), or the handler is not claimed at all.',
      last,
      after,
    );
  }
}

/** Step 1: one delivery, crashed; it must have reached its COMMIT and not be answered as a success. */
async function crashOnce(options: CrashRecoveryOptions): Promise<void> {
  const step = 'the crashed delivery';
  const crash = armCrash({ scope: options.scope, key: options.key }, HELPER);
  let answer: Awaited<ReturnType<typeof deliverOnce>>;
  try {
    answer = await deliverOnce(
      options,
      options.settleWithinMs ?? SETTLE_DEFAULTS.settleWithinMs,
      HELPER,
      step,
    );
  } finally {
    crash.disarm();
  }
  const described = describeSettled(answer.settled);
  if (crash.crashed() === 0) {
    const filter = [
      options.scope !== undefined && `scope ${JSON.stringify(options.scope)}`,
      options.key !== undefined && `key ${JSON.stringify(options.key)}`,
    ].filter(Boolean);
    throw new ExactlyOnceError(
      `${HELPER}: ${step} never reached its COMMIT (it was ${described}): no claimed delivery` +
        `${filter.length > 0 ? ` of ${filter.join(' and ')}` : ''} ran to its end in this process. ` +
        'Is the route claimed (@IdempotentWebhook, @Idempotent), does it run in this process, and are ' +
        "scope and key the claim's?",
      step,
    );
  }
  if (answer.outcome === 'delivered') {
    throw new ExactlyOnceError(
      `${HELPER}: ${step} was ${described}, a success, although it never committed: the sender will not ` +
        'deliver it again, so its effect is lost. A handler that answers by itself (@Res()) has sent its ' +
        'answer before the COMMIT.',
      step,
    );
  }
}

function recoveryCause(counted: number, external: boolean): string {
  if (counted === 0) {
    return (
      'The redelivery was answered as a success without the work being done: the event was recorded as ' +
      'done although its work never committed (a claim committed before the work, on its own).'
    );
  }
  if (external) {
    return (
      'The work ran again on the redelivery, as it must in external mode (the crash came after it), and the ' +
      "downstream applied it twice: it does not dedupe by the key it is sent (send the event's key as " +
      'Idempotency-Key), or that key is not the same on every attempt (a UUID made per call).'
    );
  }
  return 'The redelivery did the work more than once.';
}
