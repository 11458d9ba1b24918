/**
 * How a claim ended, as a strategy reports it to the service. The transports map it: HTTP to
 * 200 / 200 replayed / 409, RPC to a reply or an RpcException, a method call to its value or
 * an EventInFlightError. In flight is a result, not an error, because it is an expected answer
 * on the hot path of a duplicate storm.
 */
export type ClaimResult<T> =
  { kind: 'processed'; value: T } | { kind: 'replayed' } | { kind: 'in_flight'; retryAfterSeconds: number };
