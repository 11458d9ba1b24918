import type { ClaimResult } from '../core/claim-result.js';
import type { ClaimHandle, ClaimSpec } from '../core/claim-strategy.js';
import { claimFailedLog } from '../idempotency.messages.js';
import type { ClaimValues } from '../postgres/claim-rounds.js';
import type { ClaimFound } from '../postgres/claim-row.reader.js';
import type { ClaimTransaction } from '../postgres/claim-transaction.js';
import { errorCode, LOCK_NOT_AVAILABLE } from '../postgres/pg-errors.js';
import type { TransactionOutcomes } from './transaction-outcomes.js';

/**
 * A claim made while a transaction-mode delivery runs, in that delivery's transaction: a
 * savepoint and the claim in one round trip, then the work on the same connection. Success
 * leaves the savepoint for the enclosing COMMIT (it commits both, or neither); a failure rolls
 * back to it, so the enclosing delivery can catch the error and go on. Counted when the
 * enclosing transaction commits, as that is when the claim exists.
 */
export async function joinEnclosing<T>(
  outcomes: TransactionOutcomes,
  transaction: ClaimTransaction,
  spec: ClaimSpec,
  key: string,
  work: (handle: ClaimHandle) => Promise<T>,
): Promise<ClaimResult<T>> {
  const savepoint = transaction.savepoint();
  const started = performance.now();
  let found: ClaimFound;
  try {
    // The enclosing transaction's statements: the checked claim takes a (null) fingerprint too.
    const { scope, source } = spec;
    const { lockTimeout } = outcomes;
    const values: ClaimValues = transaction.checked
      ? { scope, key, source, lockTimeout, fingerprint: null }
      : { scope, key, source, lockTimeout };
    found = await transaction.claimAt(savepoint, values);
  } catch (error) {
    await transaction.rollbackTo(savepoint).catch(() => undefined);
    if (errorCode(error) === LOCK_NOT_AVAILABLE) {
      return outcomes.inFlight(spec, key, outcomes.config.concurrentDuplicateWaitMs);
    }
    throw outcomes.unavailable(spec, key, error, claimFailedLog);
  }
  if (found.kind !== 'claimed') {
    // Nothing was claimed, but the claim bounded the transaction's lock_timeout to a
    // duplicate's wait: rolling back to the savepoint puts the enclosing delivery's back.
    try {
      await transaction.rollbackTo(savepoint);
    } catch (error) {
      throw outcomes.unavailable(spec, key, error, claimFailedLog);
    }
    if (found.kind === 'done') return outcomes.replayed(spec, key);
    if (found.kind === 'conflict') return { kind: 'conflict', state: found.state };
    return outcomes.inFlight(spec, key, found.heldMs, found.secondsLeft);
  }
  let value: T;
  try {
    value = await work(transaction);
  } catch (error) {
    // Should the connection be gone, the enclosing delivery fails on it anyway.
    await transaction.rollbackTo(savepoint).catch(() => undefined);
    outcomes.metrics.count('failed', spec.scope, key);
    throw error;
  }
  const outcome = found.reclaimed ? 'reclaimed' : 'claimed';
  transaction.afterCommit(() => {
    outcomes.retryAfter.record(spec.scope, performance.now() - started);
    outcomes.metrics.count(outcome, spec.scope, key);
  });
  return { kind: 'processed', value };
}
