import type { ExecutionContext } from '@nestjs/common';
import type { ClaimResult } from '../core/claim-result.js';

/**
 * What `failure()` returns to end a delivery as handled instead of failed: for a delivery that
 * can never succeed (an event with an unusable key), where failing would make a broker redeliver
 * it forever. The transport has logged why.
 */
export const ACKNOWLEDGE = Symbol('idempotency:acknowledge');

/** A claim that settled: the handler ran now, or had run before, or the event was stale (ordering guard). */
export type SettledResult = Exclude<ClaimResult<unknown>, { kind: 'in_flight' }>;

/**
 * What the interceptor needs to know about one kind of execution context (`http`, `rpc`): where
 * the key extractor's arguments are, and how each result and failure is answered there. The
 * claim itself is the same for every transport (IdempotencyService).
 */
export interface DeliveryTransport {
  /** The key extractor's arguments: `(body, request)` over HTTP, `(data, context)` over RPC. */
  keyArguments(context: ExecutionContext): readonly unknown[];
  /** What the caller receives for a processed or replayed delivery. */
  answer(result: SettledResult, context: ExecutionContext): unknown;
  /**
   * What the caller receives for an error: the library's own errors (idempotency.errors.ts,
   * an in-flight duplicate among them) mapped to the transport's; a handler's errors unchanged;
   * or ACKNOWLEDGE.
   */
  failure(error: unknown, context: ExecutionContext): unknown;
}
