import { runAfterCommit } from '../core/after-commit.js';
import type { StoredResponse } from '../core/claim-check.js';
import type { ClaimHandle } from '../core/claim-strategy.js';

/** Why a lease's signal aborted: `signal.reason` is one of these, with `name` 'LeaseLostError'. */
function leaseLost(scope: string, key: string, why: 'taken' | 'expired'): Error {
  const error = new Error(
    why === 'taken'
      ? `the lease on ${key} (${scope}) was taken over by another worker: stop, it may run the event now`
      : `the lease on ${key} (${scope}) ran out before the handler finished: another worker may run the event now`,
  );
  error.name = 'LeaseLostError';
  return error;
}

/**
 * What an external-mode handler holds while it runs: its fencing token and attempt, renewal, a
 * signal that aborts when the lease is taken over or runs out, and the callbacks to run once the
 * fenced completion lands. No manager: external mode holds no claim transaction.
 */
export class LeaseHandle implements ClaimHandle {
  readonly manager = undefined;
  readonly executor = undefined;
  private controller?: AbortController;
  private timer?: ReturnType<typeof setTimeout>;
  private lostWhy?: 'taken' | 'expired';
  private callbacks?: (() => unknown)[];
  private finished = false;
  /** Key checks: the response the fenced completion stores (recordResponse). */
  response?: StoredResponse;

  constructor(
    private readonly scope: string,
    private readonly key: string,
    readonly leaseToken: string,
    readonly attempt: number,
    /** When the lease ends at the latest, by this process's clock (performance.now()). */
    private endsAt: number,
    /** Renews the lease; wired by the strategy, which calls leaseUntil() or lost() with the outcome. */
    readonly extendLease: (ms?: number) => Promise<boolean>,
  ) {}

  /** When the lease ends at the latest, by this process's clock. */
  get leaseEnds(): number {
    return this.endsAt;
  }

  /**
   * Aborts when the lease is taken over (a renewal found it lost) or runs out. Made on first use,
   * with its timer: a handler that never asks pays nothing for it.
   */
  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.lostWhy) this.controller.abort(leaseLost(this.scope, this.key, this.lostWhy));
      else this.arm();
    }
    return this.controller.signal;
  }

  /** A renewal landed: the lease now ends at `endsAt` at the latest. */
  leaseUntil(endsAt: number): void {
    if (endsAt <= this.endsAt) return;
    this.endsAt = endsAt;
    if (this.controller && !this.controller.signal.aborted) this.arm();
  }

  /** A renewal found the lease held by another worker. */
  lost(): void {
    this.abort('taken');
  }

  /** The handler has returned or thrown: the signal no longer follows the lease. */
  finish(): void {
    this.finished = true;
    clearTimeout(this.timer);
  }

  afterCommit(fn: () => unknown): void {
    (this.callbacks ??= []).push(fn);
  }

  /** Kept for the fenced completion, which writes it in its own UPDATE. */
  recordResponse(response: StoredResponse): void {
    this.response = response;
  }

  /** True when a callback waits for the completion. */
  get hasAfterCommit(): boolean {
    return this.callbacks !== undefined;
  }

  /** The after-commit callbacks; call once the fenced completion has landed. */
  runAfterCommit(failed: (error: unknown) => void): Promise<void> {
    const callbacks = this.callbacks;
    this.callbacks = undefined;
    return callbacks ? runAfterCommit(callbacks, failed) : Promise.resolve();
  }

  private arm(): void {
    clearTimeout(this.timer);
    if (this.finished) return;
    const left = this.endsAt - performance.now();
    // Run out already: aborted now, so a handler that first looks after the lease ended sees it.
    if (left <= 0) {
      this.abort('expired');
      return;
    }
    this.timer = setTimeout(() => this.abort('expired'), left);
    this.timer.unref();
  }

  private abort(why: 'taken' | 'expired'): void {
    if (this.finished || this.lostWhy) return;
    this.lostWhy = why;
    clearTimeout(this.timer);
    this.controller?.abort(leaseLost(this.scope, this.key, why));
  }
}
