import type { ExecutionContext } from '@nestjs/common';
import type { StoredResponse } from '../core/claim-check.js';
import type { ClaimResult } from '../core/claim-result.js';
import { extractIdempotencyKey } from '../core/idempotency-key.js';
import type { IdempotentWebhookMetadata } from './idempotent-webhook.decorator.js';

/**
 * What `failure()` returns to end a delivery as handled instead of failed: for a delivery that
 * can never succeed (an event with an unusable key), where failing would make a broker redeliver
 * it forever. The transport has logged why.
 */
export const ACKNOWLEDGE = Symbol('idempotency:acknowledge');

/**
 * A claim that settled: the handler ran now, or had run before (with its stored response, if any),
 * or the event was stale (ordering guard).
 */
export type SettledResult = Exclude<ClaimResult<unknown>, { kind: 'in_flight' } | { kind: 'conflict' }>;

/** A delivery's claim key, as its transport reads it (DeliveryTransport.claimKey). */
export interface DeliveryKey {
  /** The key extractor's arguments it was read from, which the ordering guard and fingerprint read too. */
  readonly args: readonly unknown[];
  /** The claim's key, checked (core/idempotency-key.ts). */
  readonly key: string;
  /**
   * True when the key is the client's own and its claim stores the answer for replays (request
   * mode): the key checks' `storesResponse`. A webhook's key (false) is the sender's event id, and
   * one that changes between copies of an event is reported (KeyFindings).
   */
  readonly storesResponse: boolean;
}

/**
 * A webhook's claim key: its decorator's `key` extractor's, from the delivery's key arguments
 * (what claimKey() answers over RPC, and for a transport without that method).
 */
export function webhookKey(
  args: readonly unknown[],
  meta: IdempotentWebhookMetadata,
  maxKeyLength: number,
): DeliveryKey {
  return {
    args,
    key: extractIdempotencyKey(meta.scope, meta.key, args, maxKeyLength),
    storesResponse: false,
  };
}

/**
 * What the interceptor needs to know about one kind of execution context (`http`, `rpc`): where
 * the key extractor's arguments are, how the claim's key is read, and how each result and failure
 * is answered there. The claim itself is the same for every transport (ClaimRunner).
 */
export interface DeliveryTransport {
  /** The key extractor's arguments: `(body, request)` over HTTP, `(data, context)` over RPC. */
  keyArguments(context: ExecutionContext): readonly unknown[];
  /**
   * The claim's key of a delivery, read from its key arguments (keyArguments()), or undefined for a delivery that runs
   * without a claim (a request-mode route without the header, which does not require it). Throws
   * the key's error (InvalidIdempotencyKeyError, ...) for a bad one, before any claim. Without
   * this method the key is a webhook's (webhookKey()).
   */
  claimKey?(context: ExecutionContext, meta: IdempotentWebhookMetadata): DeliveryKey | undefined;
  /** What the caller receives for a processed or replayed delivery. */
  answer(result: SettledResult, context: ExecutionContext, meta?: IdempotentWebhookMetadata): unknown;
  /**
   * What the caller receives for an error: the library's own errors (idempotency.errors.ts,
   * an in-flight duplicate among them) mapped to the transport's; a handler's errors unchanged;
   * or ACKNOWLEDGE.
   */
  failure(error: unknown, context: ExecutionContext, meta?: IdempotentWebhookMetadata): unknown;
  /**
   * Whether a handler that returned normally answered a failure all the same (over HTTP, a 5xx
   * status it set): what it answered (`HTTP 500`), or undefined for a success. Called after the
   * handler returned, before capture(). A failure answered fails the delivery as a throw would
   * (AnsweredFailure: rolled back, or the attempt marked failed, nothing stored), and the caller
   * receives the handler's answer. Without this method every returned value is a success.
   */
  answeredFailure?(context: ExecutionContext): string | undefined;
  /**
   * Key checks: what to store of the handler's answer for its replays (a request-mode route's
   * status, headers and body; a `@MessagePattern`'s reply), or undefined for nothing. Called in
   * the claim, after the handler returned and before the COMMIT: throwing fails the delivery.
   */
  capture?(
    value: unknown,
    context: ExecutionContext,
    meta: IdempotentWebhookMetadata,
    key: string,
  ): StoredResponse | undefined;
}
