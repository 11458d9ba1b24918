import type { ConflictState, StoredResponse } from './claim-check.js';

/**
 * How a claim ended, as a strategy reports it to the service. The transports map it: HTTP to
 * 200 / 200 replayed / 200 stale / 409, RPC to a reply or an RpcException, a method call to its
 * value or an EventInFlightError. A fingerprint that differs from the claim's (see claim-check.ts)
 * is `conflict`. In flight is a result, not an error, because it is an expected answer on the hot
 * path of a duplicate storm. Stale (the ordering guard, core/event-order.ts): the event is older
 * than its entity's applied version, its claim is done, and the handler ran only if it asked to
 * (`value` is then what it returned).
 */
export type ClaimResult<T> =
  | { kind: 'processed'; value: T; conflict?: ConflictState }
  | { kind: 'replayed'; response?: StoredResponse; conflict?: ConflictState }
  | { kind: 'in_flight'; retryAfterSeconds: number; conflict?: ConflictState }
  | { kind: 'stale'; value: T | undefined; conflict?: ConflictState }
  // Key checks (claim-check.ts): `conflict` on the four above is a conflict let through and
  // warned ('warn'); this kind is one refused ('refuse'), and nothing ran.
  | { kind: 'conflict'; state: ConflictState };
