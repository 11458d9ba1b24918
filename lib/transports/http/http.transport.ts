import { Inject, Injectable, Logger, type ExecutionContext } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { storedBody, type StoredResponse } from '../../core/claim-check.js';
import { extractIdempotencyKey } from '../../core/idempotency-key.js';
import { IDEMPOTENCY_CONFIG, REPLAYED_HEADER, STALE_HEADER } from '../../idempotency.constants.js';
import {
  EventInFlightError,
  IdempotencyError,
  IdempotencyUnavailableError,
} from '../../idempotency.errors.js';
import type { IdempotencyConfig } from '../../interfaces/index.js';
import type { DeliveryKey, DeliveryTransport, SettledResult } from '../delivery-transport.js';
import type { IdempotentWebhookMetadata } from '../idempotent-webhook.decorator.js';
import { clientKey, requestIdempotencyKey } from './request-mode.js';
import { captureHttpResponse } from './stored-http-response.js';

/**
 * Webhooks over HTTP (Express or Fastify, through Nest's adapter).
 *
 * | outcome | webhook answer | request-mode answer (`@IdempotentRequest`) |
 * |---|---|---|
 * | processed | the handler's answer (200) | the handler's answer (Nest's status: 201 for POST) |
 * | replayed | 200, `Idempotent-Replayed: true`, handler not called | the stored status, headers and body, `Idempotent-Replayed: true` |
 * | stale (ordering guard) | 200, `Idempotent-Stale: true`, handler not called (or its answer, with `runStale`) | (no ordering guard) |
 * | in flight | 409 (or `inFlightStatus`), `Retry-After` | the same, problem details |
 * | key reused (another fingerprint) | 422 with `onKeyConflict: 'refuse'` | 422, problem details |
 * | bad or missing key (or entity or version) | 400, nothing written | 400, problem details |
 * | a body no parser read (default fingerprint) | (no such check) | 415, problem details, nothing written |
 * | database unavailable | 503, `Retry-After` | the same, problem details |
 * | handler went on after a failed statement | 500, nothing written | the same, problem details |
 * | handler returned with a 5xx status it set | its answer; rolled back, nothing stored, run again | the same |
 */
@Injectable()
export class HttpTransport implements DeliveryTransport {
  private readonly logger = new Logger('IdempotencyModule');

  constructor(
    private readonly adapterHost: HttpAdapterHost,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
  ) {}

  /** `(body, request)`. Read by index: switchToHttp() builds closures on every call. */
  keyArguments(context: ExecutionContext): readonly unknown[] {
    const request = context.getArgByIndex<{ body?: unknown }>(0);
    return [request.body, request];
  }

  /**
   * A webhook's key is its `key` extractor's; a request-mode route's the client's Idempotency-Key
   * header (with its owner), its answer stored for replays, or none without the header where the
   * route does not require one.
   */
  claimKey(context: ExecutionContext, meta: IdempotentWebhookMetadata): DeliveryKey | undefined {
    const args = this.keyArguments(context);
    const { maxKeyLength } = this.config;
    if (!meta.request) {
      return {
        args,
        key: extractIdempotencyKey(meta.scope, meta.key, args, maxKeyLength),
        storesResponse: false,
      };
    }
    const key = requestIdempotencyKey(meta.scope, meta.request, args[1] as never, maxKeyLength);
    return key === undefined ? undefined : { args, key, storesResponse: true };
  }

  answer(result: SettledResult, context: ExecutionContext, meta?: IdempotentWebhookMetadata): unknown {
    if (result.kind === 'processed') return result.value;
    if (result.kind === 'stale') {
      this.setHeader(context, STALE_HEADER, 'true');
      return result.value;
    }
    this.setHeader(context, REPLAYED_HEADER, 'true');
    // A webhook's replay answers nothing: its sender only needs the 2xx.
    if (!meta?.request) return undefined;
    return this.replay(context, result.response);
  }

  /**
   * The library's errors are HttpExceptions already: those that ask for a retry say when. On a
   * request-mode route its ProblemDetailsFilter answers them as problem details, naming the key
   * the client sent: the claim's key of a route with owners starts with the owner, which no
   * answer echoes (whatever message named it: the interceptor's, the strategy's).
   */
  failure(error: unknown, context: ExecutionContext, meta?: IdempotentWebhookMetadata): unknown {
    if (error instanceof EventInFlightError || error instanceof IdempotencyUnavailableError) {
      this.setHeader(context, 'Retry-After', String(error.retryAfterSeconds));
    }
    // The route's own claim only: a claim the handler made inside it has a key of its own.
    if (
      meta?.request?.owner &&
      error instanceof IdempotencyError &&
      error.key !== undefined &&
      error.scope === meta.scope
    ) {
      error.withClientKey(clientKey(meta.request, error.key));
    }
    return error;
  }

  /**
   * A 5xx status on the response when the handler returned (set through `@Res({ passthrough:
   * true })`, or the route's `@HttpCode`): a failure, rolled back and not stored, as a throw is.
   * A 4xx set that way is an answer (stored and replayed); a refusal that leaves no claim is thrown.
   */
  answeredFailure(context: ExecutionContext): string | undefined {
    const status = context.getArgByIndex<{ statusCode: number }>(1).statusCode;
    return status >= 500 ? `HTTP ${status}` : undefined;
  }

  /** Request mode: the status, listed headers and body the route answered, for its replays. */
  capture(
    value: unknown,
    context: ExecutionContext,
    meta: IdempotentWebhookMetadata,
    key: string,
  ): StoredResponse | undefined {
    const mode = meta.request;
    if (!mode) return undefined;
    const settings = {
      scope: meta.scope,
      key,
      replayHeaders: mode.replayHeaders,
      maxBodyBytes: mode.maxStoredResponseBytes ?? this.config.maxStoredResponseBytes,
      workDone: meta.mode === 'external',
    };
    return captureHttpResponse(value, context.getArgByIndex(1), settings, (message) =>
      this.logger.error(message),
    );
  }

  /** Answers a replay as the first request was answered. */
  private replay(context: ExecutionContext, response: StoredResponse | undefined): unknown {
    // A claim made before its route stored responses has none: the route's own status, no body.
    if (!response) return undefined;
    const reply = context.getArgByIndex(1);
    if (response.status !== undefined) this.adapterHost.httpAdapter.status(reply, response.status);
    for (const [name, value] of Object.entries(response.headers ?? {})) this.setHeader(context, name, value);
    return storedBody(response);
  }

  /**
   * Express and Fastify set headers differently; the adapter knows which. A list (a replay's two
   * `Set-Cookie`s) is sent as one header line each, which both adapters do for an array.
   */
  private setHeader(context: ExecutionContext, name: string, value: string | readonly string[]): void {
    this.adapterHost.httpAdapter.setHeader(context.getArgByIndex(1), name, value as string);
  }
}
