import { processWide } from './process-wide.js';

/**
 * A crash a test has armed (the testing entry point's `crashBeforeCommit()`): the next `times`
 * deliveries that match lose their COMMIT (transaction mode) or their completion (external
 * mode), as if the process had been killed between the work and that write.
 */
export interface CommitFault {
  /** Only deliveries of this scope; every scope when undefined. */
  readonly scope?: string;
  /** Only deliveries of this key; every key when undefined. */
  readonly key?: string;
  /** Deliveries still to crash. */
  times: number;
}

/** Armed faults, one set per process (both builds of the package see the same). */
const faults = processWide('commit-faults', () => new Set<CommitFault>());

/** Arms `fault`; the returned function disarms it (a fault also disarms once `times` reaches 0). */
export function armCommitFault(fault: CommitFault): () => void {
  faults.add(fault);
  return () => faults.delete(fault);
}

/**
 * True when the delivery of (scope, key) is to crash before its COMMIT, counting it. The claim
 * path calls this only while a fault is armed (`commitFaultsArmed`), so a delivery pays one
 * size check for the feature.
 */
export function takeCommitFault(scope: string, key: string): boolean {
  for (const fault of faults) {
    if ((fault.scope ?? scope) !== scope || (fault.key ?? key) !== key) continue;
    if (--fault.times <= 0) faults.delete(fault);
    return true;
  }
  return false;
}

/** True while any fault is armed. */
export function commitFaultsArmed(): boolean {
  return faults.size > 0;
}
