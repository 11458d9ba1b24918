import { Inject, Injectable, Logger, type ExecutionContext, type OnModuleInit } from '@nestjs/common';
import { storedBody, type StoredResponse } from '../../core/claim-check.js';
import { loadOptionalPeer } from '../../core/optional-peer.js';
import { IDEMPOTENCY_CONFIG } from '../../idempotency.constants.js';
import {
  EventInFlightError,
  IdempotencyError,
  IdempotencyUnavailableError,
  InvalidEventOrderError,
  InvalidIdempotencyKeyError,
} from '../../idempotency.errors.js';
import type { IdempotencyConfig } from '../../interfaces/index.js';
import {
  ACKNOWLEDGE,
  webhookKey,
  type DeliveryKey,
  type DeliveryTransport,
  type SettledResult,
} from '../delivery-transport.js';
import type { IdempotentWebhookMetadata } from '../idempotent-webhook.decorator.js';

const replyNotStored = (scope: string, reason: string) =>
  `${scope} replied ${reason}, so its reply is not stored: a replay of the message answers nothing`;

const eventKeyRejected = (reason: string) =>
  `${reason}; the event was acknowledged without running its handler (a redelivery would be refused the same way)`;

/**
 * @nestjs/microservices' PATTERN_HANDLER_METADATA and PatternHandler.EVENT, as values rather than
 * imports: the package is optional.
 */
const HANDLER_TYPE = 'microservices:handler_type';
const EVENT_HANDLER = 2;

/** The error an RPC caller receives from the library, as the transport serializes it. */
export interface IdempotencyRpcError {
  status: 'error';
  code: IdempotencyError['code'];
  message: string;
  scope: string;
  key?: string;
  /** In flight and unavailable: seconds to wait before delivering again. */
  retryAfterSeconds?: number;
}

/** @nestjs/microservices' RpcException, loaded only when an app has it (it is an optional peer). */
type RpcExceptionClass = new (error: object) => Error;

/**
 * `@EventPattern` and `@MessagePattern` handlers of @nestjs/microservices (TCP, Redis, NATS,
 * RabbitMQ, Kafka, ...). A processed message answers the handler's value; a replayed one answers
 * nothing and the handler does not run, so the transport acknowledges it. The library's errors
 * become RpcExceptions whose error is an `IdempotencyRpcError` (with the original as `cause`),
 * so a `send()` caller sees the code and the retry delay; what each transport does with an error
 * of an event handler is in docs/transports.md ("Microservices"). A stale message (ordering guard) answers
 * as a replayed one, or the handler's value with `runStale`. An event whose key (or ordering
 * guard's entity or version) is unusable is logged
 * and acknowledged rather than failed: its redelivery would fail the same way, and on Kafka a
 * failing event is retried forever, blocking its partition.
 */
@Injectable()
export class RpcTransport implements DeliveryTransport, OnModuleInit {
  private readonly logger = new Logger('IdempotencyModule');
  private rpcException?: RpcExceptionClass;

  constructor(@Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig) {}

  /** Loaded at start-up, not on the first message: an rpc context exists only with the package. */
  async onModuleInit(): Promise<void> {
    try {
      const microservices =
        await loadOptionalPeer<typeof import('@nestjs/microservices')>('@nestjs/microservices');
      this.rpcException = microservices.RpcException as RpcExceptionClass;
    } catch {
      // No @nestjs/microservices: no rpc context will ever reach the interceptor.
    }
  }

  /** `(data, context)`: the message's payload and its transport context (TcpContext, KafkaContext, ...). */
  keyArguments(context: ExecutionContext): readonly unknown[] {
    return [context.getArgByIndex(0), context.getArgByIndex(1)];
  }

  /** A message's key is its `key` extractor's: RPC has no request mode. */
  claimKey(context: ExecutionContext, meta: IdempotentWebhookMetadata): DeliveryKey {
    return webhookKey(this.keyArguments(context), meta, this.config.maxKeyLength);
  }

  /**
   * A replayed `@MessagePattern` answers the reply its first delivery stored (see capture): the
   * parse of its JSON text, which the transport serialises to the same text, keys in their order.
   */
  answer(result: SettledResult): unknown {
    if (result.kind === 'processed' || result.kind === 'stale') return result.value;
    return result.response && storedBody(result.response);
  }

  /**
   * A `@MessagePattern`'s reply, stored with its claim, so that a replayed message answers the
   * caller what the first answered, not nothing. An event handler's value goes nowhere: nothing
   * is stored for it. A reply that is not JSON, or over `maxStoredResponseBytes`, is not stored.
   */
  capture(value: unknown, context: ExecutionContext, meta: { scope: string }): StoredResponse | undefined {
    if (value === undefined || Reflect.getMetadata(HANDLER_TYPE, context.getHandler()) === EVENT_HANDLER) {
      return undefined;
    }
    let json: string | undefined;
    try {
      json = JSON.stringify(value);
    } catch {
      json = undefined;
    }
    if (json === undefined) {
      this.logger.warn(replyNotStored(meta.scope, 'a value that is not JSON'));
      return undefined;
    }
    const bytes = Buffer.byteLength(json);
    if (bytes > this.config.maxStoredResponseBytes) {
      this.logger.warn(replyNotStored(meta.scope, `${bytes} bytes, more than maxStoredResponseBytes`));
      return undefined;
    }
    // The text itself: a jsonb string keeps it as it is, where jsonb would sort an object's keys.
    return { json };
  }

  failure(error: unknown, context: ExecutionContext): unknown {
    if (
      (error instanceof InvalidIdempotencyKeyError || error instanceof InvalidEventOrderError) &&
      Reflect.getMetadata(HANDLER_TYPE, context.getHandler()) === EVENT_HANDLER
    ) {
      this.logger.error(eventKeyRejected(error.message));
      return ACKNOWLEDGE;
    }
    if (!(error instanceof IdempotencyError) || !this.rpcException) return error;
    const payload: IdempotencyRpcError = {
      status: 'error',
      code: error.code,
      message: error.message,
      scope: error.scope,
      key: error.key,
    };
    if (error instanceof EventInFlightError || error instanceof IdempotencyUnavailableError) {
      payload.retryAfterSeconds = error.retryAfterSeconds;
    }
    const exception = new this.rpcException(payload);
    (exception as { cause?: unknown }).cause = error;
    return exception;
  }
}
