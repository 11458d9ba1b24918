/**
 * Every counted outcome of a delivery:
 * - `claimed`: first delivery, the handler ran (or is running).
 * - `replayed`: already done; answered 200 with `Idempotent-Replayed: true`, handler not called.
 * - `in_flight`: another worker holds the claim; answered 409 (or 503) with `Retry-After`.
 * - `reclaimed`: an expired lease or a failed attempt was taken over; the handler ran again.
 * - `stale`: the ordering guard found the event older than its entity's applied version; its claim
 *   is done, answered 200 with `Idempotent-Stale: true`, the handler not called (or called with
 *   `context.stale`, with `runStale`).
 * - `failed`: the handler threw; the claim was rolled back (transaction), or marked failed (external;
 *   should the mark itself fail, the lease expires and the event is re-claimed then).
 * - `lease_lost`: an external handler returned or threw after another worker took its lease over.
 * - `expired`: the reporter found a lease whose worker died holding it.
 * - `released`: an operator took an in-progress claim away from its holder (`IdempotencyClaims.release`);
 *   the next delivery re-claims it.
 * - `forgotten`: an operator deleted a claim (`IdempotencyClaims.forget`); the next delivery
 *   processes the event again. (The `claims` CLI runs in a process of its own: its actions are not
 *   counted in the app.)
 * - `key_conflict`: a delivery's fingerprint differed from its claim's (a key reused for another
 *   request or event); refused with 422, or counted beside the delivery's own outcome when let
 *   through (`onKeyConflict: 'replay'`).
 * - `key_unstable`: a webhook's fingerprint arrived under a second key (`detectUnstableKeys`),
 *   counted beside the delivery's own outcome.
 */
export type ClaimOutcome =
  | 'claimed'
  | 'replayed'
  | 'in_flight'
  | 'reclaimed'
  | 'stale'
  | 'failed'
  | 'lease_lost'
  | 'expired'
  | 'released'
  | 'forgotten'
  | 'key_conflict'
  | 'key_unstable';

/** Passed to the `onOutcome` hook. */
export interface ClaimOutcomeEvent {
  outcome: ClaimOutcome;
  scope: string;
  key: string;
}
