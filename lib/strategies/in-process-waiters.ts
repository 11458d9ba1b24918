/** How the delivery a duplicate waited for ended. */
export type FirstOutcome = 'committed' | 'not_committed';

/**
 * Key checks: what a committed delivery stored, handed to its waiters so that they are answered
 * (replayed with the response, or refused for another fingerprint) with no round trip.
 */
export interface CommittedClaim {
  readonly fingerprint: string | null;
  readonly response?: unknown;
}

/** A waiting duplicate's callback. */
type Wake = (outcome: FirstOutcome, committed?: CommittedClaim) => void;

/**
 * Deliveries of this process that are claiming or running, by claim id, each with the duplicates
 * waiting for it. A duplicate waits here holding no pool connection, so a storm of duplicates
 * cannot starve unrelated events, and learns how the first ended: after a commit it is answered
 * replayed with no round trip; otherwise one waiter claims in its place and the rest wait on that
 * one. Duplicates at other replicas still wait in Postgres, bounded by lock_timeout.
 *
 * A delivery with no duplicate costs one map entry holding a number (when it started): the list
 * of waiters is made only when a duplicate arrives.
 */
export class InProcessWaiters {
  /** Running deliveries → when they started (performance.now()). */
  private readonly running = new Map<string, number>();
  /** Running deliveries that have duplicates waiting → their callbacks. */
  private readonly waiting = new Map<string, Wake[]>();
  /** Key checks: running deliveries that have a fingerprint → it (an entry only for those). */
  private readonly fingerprints = new Map<string, string>();

  /** True while a delivery of `id` runs in this process. */
  has(id: string): boolean {
    return this.running.has(id);
  }

  /** How long the delivery of `id` has been running, in ms (0 when none runs). */
  heldMs(id: string): number {
    const started = this.running.get(id);
    return started === undefined ? 0 : performance.now() - started;
  }

  /** Registers the delivery of `id` as running; call before the first await, so duplicates find it. */
  begin(id: string, fingerprint?: string | null): void {
    this.running.set(id, performance.now());
    if (fingerprint) this.fingerprints.set(id, fingerprint);
  }

  /**
   * Key checks: the fingerprint of the delivery of `id` running now, so that a duplicate of
   * another fingerprint is told at once, without waiting for it (its claim is not visible yet).
   */
  fingerprintOf(id: string): string | undefined {
    return this.fingerprints.get(id);
  }

  /** Ends the delivery of `id` and tells every waiter how. */
  end(id: string, outcome: FirstOutcome, committed?: CommittedClaim): void {
    this.running.delete(id);
    this.fingerprints.delete(id);
    const waiting = this.waiting.get(id);
    if (!waiting) return;
    this.waiting.delete(id);
    for (const wake of waiting) wake(outcome, committed);
  }

  /**
   * Resolves with how the delivery now running for `id` ended, or `timeout` if `ms` passes first
   * (at once when `ms` is not positive, or nothing runs for `id`: `not_committed`). A waiter that
   * times out is forgotten at once, so a long first delivery does not keep every timed-out
   * duplicate's callback alive.
   */
  wait(id: string, ms: number): Promise<FirstOutcome | 'timeout'> {
    return this.waitFor(id, ms).then(({ outcome }) => outcome);
  }

  /** wait(), with what the first stored when it committed (key checks; see CommittedClaim). */
  waitFor(
    id: string,
    ms: number,
  ): Promise<{ outcome: FirstOutcome | 'timeout'; committed?: CommittedClaim }> {
    if (!this.running.has(id)) return Promise.resolve({ outcome: 'not_committed' });
    if (ms <= 0) return Promise.resolve({ outcome: 'timeout' });
    let waiting = this.waiting.get(id);
    if (!waiting) this.waiting.set(id, (waiting = []));
    const list = waiting;
    return new Promise((resolve) => {
      const wake: Wake = (outcome, committed) => {
        clearTimeout(timer);
        resolve({ outcome, committed });
      };
      const timer = setTimeout(() => {
        const index = list.indexOf(wake);
        if (index >= 0) list.splice(index, 1);
        if (list.length === 0 && this.waiting.get(id) === list) this.waiting.delete(id);
        resolve({ outcome: 'timeout' });
      }, ms);
      list.push(wake);
    });
  }

  /** Callbacks held for `id`'s waiters now (for tests of the clean-up). */
  waitingFor(id: string): number {
    return this.waiting.get(id)?.length ?? 0;
  }
}
