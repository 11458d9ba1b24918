import { armCommitFault, type CommitFault } from '../core/commit-faults.js';

/** Which deliveries `crashBeforeCommit` crashes. */
export interface CrashOptions {
  /** Only deliveries of this claim scope (the decorator's `scope`, by default `Class.method`). @default every scope */
  scope?: string;
  /** Only deliveries of this event key. @default every key */
  key?: string;
  /** How many matching deliveries crash; then it disarms itself. @default 1 */
  times?: number;
}

/**
 * Makes the next matching deliveries in this process crash between their work and their COMMIT,
 * as a process killed there would, without killing anything: the seed's `sys.exit(1)` inside the
 * handler, done from the test. Returns a function that disarms what is left of it (call it in a
 * `finally` or `afterEach`; it is harmless once the crashes have happened).
 *
 * - Transaction mode: the handler runs, then its transaction rolls back instead of committing
 *   (the claim and every write through the claim's manager are gone, as Postgres discards a dead
 *   session's transaction) and the delivery is answered as a COMMIT whose answer was lost: 503 +
 *   Retry-After over HTTP, `IdempotencyUnavailableError` in process. A write that landed anyway
 *   was made outside the claim's transaction.
 * - External mode: the handler's work runs to the end, then its completion is never sent; the
 *   delivery is answered 503, and the lease stays in progress until it expires, as a dead
 *   worker's would (a redelivery is told 409 until then; `expireLease()` ends it now).
 *
 * Claims made inside a delivery (nested, in its transaction) are not crashed themselves: they
 * commit or roll back with the delivery that holds them. Only deliveries of this process are
 * affected: a child process or another replica needs a real kill.
 *
 * ```ts
 * const disarm = crashBeforeCommit({ scope: 'stripe.orders', key: event.id });
 * try {
 *   expect((await send(event)).status).toBe(503);
 *   expect(await orders(event.id)).toBe(0); // rolled back with the claim
 * } finally {
 *   disarm();
 * }
 * ```
 */
export function crashBeforeCommit(options: CrashOptions = {}): () => void {
  return armCrash(options, 'crashBeforeCommit').disarm;
}

/** An armed crash: `crashed()` says how many deliveries it has crashed so far. */
export interface ArmedCrash {
  disarm(): void;
  crashed(): number;
}

/** crashBeforeCommit, keeping hold of the fault so a helper can tell whether it fired. */
export function armCrash(options: CrashOptions, helper: string): ArmedCrash {
  const times = options.times ?? 1;
  if (!Number.isInteger(times) || times < 1) {
    throw new TypeError(`${helper}: times must be a whole number of at least 1, got ${String(times)}`);
  }
  for (const name of ['scope', 'key'] as const) {
    const value = options[name];
    if (value !== undefined && (typeof value !== 'string' || value === '')) {
      // An empty filter matches nothing, and a test would wait for a crash that never comes.
      throw new TypeError(
        `${helper}: ${name} must be a non-empty string when given, got ${JSON.stringify(value)}`,
      );
    }
  }
  const fault: CommitFault = { scope: options.scope, key: options.key, times };
  const disarm = armCommitFault(fault);
  return {
    disarm: () => void disarm(),
    crashed: () => times - Math.max(fault.times, 0),
  };
}
