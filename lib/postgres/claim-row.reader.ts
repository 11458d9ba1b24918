import type { PoolClient } from 'pg';
import {
  fingerprintsConflict,
  type ClaimCheck,
  type ConflictState,
  type StoredResponse,
} from '../core/claim-check.js';
import { claimUnsettled } from '../idempotency.messages.js';
import { claimParameters, type ClaimValues } from './claim-rounds.js';
import type { ClaimStatements } from './claim.sql.js';
import { ClaimTakenError } from './commit-batch.js';
import { claimQuery } from './statement-executor.js';

/**
 * The claim's answer when nothing was inserted needs at most a reclaim and a re-read to settle
 * (and, claimed at commit, a wait for the key's lock before them).
 */
const MAX_SETTLE_ROUNDS = 4;

/** The row the transaction claim answers with (see ClaimStatements.transactionClaim). */
export interface ClaimRow {
  claimed: boolean;
  status: string | null;
  previous: string;
  /** Key checks only (claimStatements' `checked`): the claim's fingerprint and stored response. */
  fingerprint?: string | null;
  response?: StoredResponse | null;
  /** The claim at commit's only (ClaimStatements.claimAtCommit): whether it took the key's lock. */
  locked?: boolean;
}

/**
 * What a transaction-mode claim found, the one value the strategy acts on: the event is this
 * delivery's now (first claim, or one taken back from a failed attempt or an expired lease), it is
 * done already, or an external-mode lease on the same scope holds it (`secondsLeft` of its lease,
 * held for `heldMs` so far).
 */
export type ClaimFound =
  | { readonly kind: 'claimed'; readonly reclaimed: boolean; readonly conflict?: ConflictState }
  | { readonly kind: 'done'; readonly fingerprint?: string | null; readonly response?: StoredResponse | null }
  | {
      readonly kind: 'leased';
      readonly secondsLeft: number;
      readonly heldMs: number;
      readonly conflict?: ConflictState;
    }
  // Key checks (a ClaimCheck given): a failed claim or a lease of another fingerprint, refused.
  | { readonly kind: 'conflict'; readonly state: ConflictState };

const FIRST_CLAIM: ClaimFound = { kind: 'claimed', reclaimed: false };
const RECLAIMED: ClaimFound = { kind: 'claimed', reclaimed: true };
const DONE: ClaimFound = { kind: 'done' };

/**
 * A first claim made at the COMMIT (ClaimStatements.claimAtCommit): the key's lock taken and no
 * row, which the COMMIT's query inserts. The one object of that meaning, so its claimer can tell it
 * by identity and keep the claim's values for the insert.
 */
export const CLAIMED_AT_COMMIT: ClaimFound = { kind: 'claimed', reclaimed: false };

/**
 * What a claim's first row means when it needs no statement more: inserted (ours), claimed at
 * commit (ours, its row to be written by the COMMIT: CLAIMED_AT_COMMIT), or done (with key checks,
 * with the claim's fingerprint and stored response). The first round of settleClaim(), without its
 * promise; undefined for every other row.
 */
export function foundAtOnce(row: ClaimRow, check?: ClaimCheck): ClaimFound | undefined {
  if (row.claimed) return row.locked ? CLAIMED_AT_COMMIT : FIRST_CLAIM;
  if (row.status !== 'done') return undefined;
  return check ? { kind: 'done', fingerprint: row.fingerprint, response: row.response } : DONE;
}

/**
 * What the claim's row means. Inserted: ours. Done: done. Failed (a handler that threw), or an
 * external-mode lease (the same scope claimed in the other mode): taken back when it is failed
 * or its lease has run out, else the lease is live. Not visible to the claim's snapshot
 * (committed by a concurrent delivery while the claim waited on it): read again. Gone since
 * (retention): claimed anew. These extra round trips happen only off the happy path; they go
 * unnamed, as they are rare.
 */
export async function settleClaim(
  client: PoolClient,
  statements: ClaimStatements,
  first: ClaimRow,
  values: ClaimValues,
  check?: ClaimCheck,
): Promise<ClaimFound> {
  const { scope, key, lockTimeout } = values;
  // Key checks: the checked reclaim takes the delivery's fingerprint as its fifth value.
  const fingerprint = values.fingerprint === undefined ? [] : [values.fingerprint];
  let row = first;
  for (let round = 1; round <= MAX_SETTLE_ROUNDS; round++) {
    // The claim at commit: the key's lock taken and no row (at once, or after the wait below).
    if (row.claimed && row.locked) return CLAIMED_AT_COMMIT;
    if (row.locked === false && row.status === null) {
      // Another delivery holds the key and has not committed: wait for it as for a claim's row
      // lock (lock_timeout, 55P03 when it runs out), then read the claim again.
      const wait = [scope, key, lockTimeout, first.previous];
      const [waited] = (await client.query(claimQuery(statements.claimAtCommitWait!, wait, false))).rows;
      // A snapshot taken for the whole transaction (a server, database or role default above
      // READ COMMITTED) cannot see what the holder committed: the delivery starts again.
      if (!waited.fresh_snapshots) throw new ClaimTakenError();
      row = (await client.query(claimQuery(statements.claimAtCommit!, [scope, key], false)))
        .rows[0] as ClaimRow;
      continue;
    }
    if (row.claimed) {
      // Claimed by a statement sent again: its RETURNING restored the bound it found, which
      // is the duplicate wait's, not the transaction's own.
      if (round > 1) {
        await client.query(claimQuery(statements.restoreLockTimeout, [first.previous], false));
      }
      return round > 1 ? RECLAIMED : FIRST_CLAIM;
    }
    if (row.status === 'done') {
      return check ? { kind: 'done', fingerprint: row.fingerprint, response: row.response } : DONE;
    }
    if (row.status === 'failed' || row.status === 'in_progress') {
      // Key checks: a claim left by a delivery of another fingerprint is refused before it is
      // taken over, or taken over and the conflict reported (see ClaimCheck).
      const conflict: ConflictState | undefined =
        check && fingerprintsConflict(check.fingerprint, row.fingerprint)
          ? row.status === 'failed'
            ? 'failed'
            : 'in_flight'
          : undefined;
      if (conflict && check!.refuse) return { kind: 'conflict', state: conflict };
      const reclaim = [scope, key, lockTimeout, first.previous, ...fingerprint];
      const reclaimed = await client.query(claimQuery(statements.transactionReclaim, reclaim, false));
      if (reclaimed.rowCount === 1)
        return conflict ? { kind: 'claimed', reclaimed: true, conflict } : RECLAIMED;
    }
    const [state] = (await client.query(claimQuery(statements.claimState, [scope, key], false))).rows;
    if (state?.status === 'in_progress' && state.live) {
      const conflict = check && fingerprintsConflict(check.fingerprint, state.fingerprint);
      if (conflict && check.refuse) return { kind: 'conflict', state: 'in_flight' };
      return {
        kind: 'leased',
        secondsLeft: Number(state.seconds_left),
        heldMs: Number(state.held_ms),
        ...(conflict ? { conflict: 'in_flight' as const } : {}),
      };
    }
    row = state
      ? {
          claimed: false,
          status: state.status as string,
          previous: first.previous,
          fingerprint: state.fingerprint,
          response: state.response,
        }
      : // Gone since (retention): claim it anew.
        ((await client.query(claimQuery(statements.transactionClaim, claimParameters(values), false)))
          .rows[0] as ClaimRow);
  }
  throw new Error(claimUnsettled(scope, key));
}
