/** How the delivery a duplicate waited for ended. */
export type FirstOutcome = 'committed' | 'not_committed';

/**
 * Deliveries of this process that are claiming or running, by claim id, each with the duplicates
 * waiting for it. A duplicate waits here holding no pool connection, so a storm of duplicates
 * cannot starve unrelated events, and learns how the first ended: after a commit it is answered
 * replayed with no round trip; otherwise one waiter claims in its place and the rest wait on that
 * one. Duplicates at other replicas still wait in Postgres, bounded by lock_timeout.
 */
export class InProcessWaiters {
  /** Plain callbacks, so the first delivery pays no promise for its waiters. */
  private readonly running = new Map<string, ((outcome: FirstOutcome) => void)[]>();

  /** True while a delivery of `id` runs in this process. */
  has(id: string): boolean {
    return this.running.has(id);
  }

  /** Registers the delivery of `id` as running; call before the first await, so duplicates find it. */
  begin(id: string): void {
    this.running.set(id, []);
  }

  /** Ends the delivery of `id` and tells every waiter how. */
  end(id: string, outcome: FirstOutcome): void {
    const waiting = this.running.get(id);
    this.running.delete(id);
    if (waiting) for (const wake of waiting) wake(outcome);
  }

  /**
   * Resolves with how the delivery now running for `id` ended, or `timeout` if `ms` passes first
   * (at once when `ms` is not positive, or nothing runs for `id`: `not_committed`).
   */
  wait(id: string, ms: number): Promise<FirstOutcome | 'timeout'> {
    const waiting = this.running.get(id);
    if (!waiting) return Promise.resolve('not_committed');
    if (ms <= 0) return Promise.resolve('timeout');
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve('timeout'), ms);
      waiting.push((outcome) => {
        clearTimeout(timer);
        resolve(outcome);
      });
    });
  }
}
