import { Injectable, type ExecutionContext } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { REPLAYED_HEADER, STALE_HEADER } from '../../idempotency.constants.js';
import { EventInFlightError, IdempotencyUnavailableError } from '../../idempotency.errors.js';
import type { DeliveryTransport, SettledResult } from '../delivery-transport.js';

/**
 * Webhooks over HTTP (Express or Fastify, through Nest's adapter).
 *
 * | outcome | answer |
 * |---|---|
 * | processed | the handler's answer (200) |
 * | replayed | 200, `Idempotent-Replayed: true`, handler not called |
 * | stale (ordering guard) | 200, `Idempotent-Stale: true`, handler not called (or its answer, with `runStale`) |
 * | in flight | 409 (or `inFlightStatus`), `Retry-After` |
 * | bad key, entity or version | 400, nothing written |
 * | database unavailable | 503, `Retry-After` |
 * | handler went on after a failed statement | 500, nothing written |
 */
@Injectable()
export class HttpTransport implements DeliveryTransport {
  constructor(private readonly adapterHost: HttpAdapterHost) {}

  /** `(body, request)`. Read by index: switchToHttp() builds closures on every call. */
  keyArguments(context: ExecutionContext): readonly unknown[] {
    const request = context.getArgByIndex<{ body?: unknown }>(0);
    return [request.body, request];
  }

  answer(result: SettledResult, context: ExecutionContext): unknown {
    if (result.kind === 'processed') return result.value;
    if (result.kind === 'stale') {
      this.setHeader(context, STALE_HEADER, 'true');
      return result.value;
    }
    this.setHeader(context, REPLAYED_HEADER, 'true');
    return undefined;
  }

  /** The library's errors are HttpExceptions already: those that ask for a retry say when. */
  failure(error: unknown, context: ExecutionContext): unknown {
    if (error instanceof EventInFlightError || error instanceof IdempotencyUnavailableError) {
      this.setHeader(context, 'Retry-After', String(error.retryAfterSeconds));
    }
    return error;
  }

  /** Express and Fastify set headers differently; the adapter knows which. */
  private setHeader(context: ExecutionContext, name: string, value: string): void {
    this.adapterHost.httpAdapter.setHeader(context.getArgByIndex(1), name, value);
  }
}
