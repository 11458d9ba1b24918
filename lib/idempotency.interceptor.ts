import {
  BadRequestException,
  HttpException,
  Inject,
  Injectable,
  InternalServerErrorException,
  ServiceUnavailableException,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { HttpAdapterHost, Reflector } from '@nestjs/core';
import { lastValueFrom, Observable } from 'rxjs';
import { ClaimUnavailableError, TransactionAbortedError, type ClaimResult } from './claims/claim-result.js';
import { LeaseClaim } from './claims/lease-claim.js';
import { TransactionClaim } from './claims/transaction-claim.js';
import { IDEMPOTENT_WEBHOOK_METADATA, IDEMPOTENCY_CONFIG, REPLAYED_HEADER } from './idempotency.constants.js';
import { runInIdempotencyContext, type IdempotencyStore } from './idempotency-context.js';
import {
  databaseUnavailable,
  duplicateInFlight,
  keyEmpty,
  keyExtractorThrew,
  keyHasNul,
  keyNotWellFormed,
  keyNotString,
  keyTooLong,
  transactionAborted,
} from './idempotency.messages.js';
import type { IdempotencyConfig, IdempotentWebhookMetadata } from './interfaces/index.js';

/** A UTF-16 surrogate without its pair (String.prototype.isWellFormed is ES2024). */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * Applied by `@IdempotentWebhook`: extracts and checks the key, runs the handler through the claim
 * strategy for its mode, and maps the outcome to HTTP. The SQL lives in the strategies.
 *
 * | outcome | answer |
 * |---|---|
 * | processed | the handler's answer (200) |
 * | replayed | 200, `Idempotent-Replayed: true`, handler not called |
 * | in flight | 409 (or `inFlightStatus`), `Retry-After` |
 * | bad key | 400, nothing written |
 * | database unavailable | 503, `Retry-After` |
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  constructor(
    private readonly reflector: Reflector,
    private readonly adapterHost: HttpAdapterHost,
    private readonly transactionClaim: TransactionClaim,
    private readonly leaseClaim: LeaseClaim,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const meta = this.reflector.get<IdempotentWebhookMetadata | undefined>(
      IDEMPOTENT_WEBHOOK_METADATA,
      context.getHandler(),
    );
    if (!meta || context.getType() !== 'http') return next.handle();
    const http = context.switchToHttp();
    const request = http.getRequest();
    const response = http.getResponse();
    // A plain Observable over the claim's promise: rxjs' defer() and from() would add promises of
    // their own to every delivery, and each pays AsyncLocalStorage's hooks.
    return new Observable((subscriber) => {
      const key = this.keyOf(meta, request); // a throw here reaches the subscriber as the error
      this.claim(meta, key, next).then(
        (result) => {
          let value: unknown;
          try {
            value = this.answer(result, key, response);
          } catch (error) {
            subscriber.error(error);
            return;
          }
          subscriber.next(value);
          subscriber.complete();
        },
        (error: unknown) => subscriber.error(this.failure(error, key, response)),
      );
    });
  }

  /** Runs the handler under the claim for its mode, in the delivery's context. */
  private claim(
    meta: IdempotentWebhookMetadata,
    key: string,
    next: CallHandler,
  ): Promise<ClaimResult<unknown>> {
    const store = { key, scope: meta.scope, source: meta.source, external: meta.external };
    // next.handle() is cold: subscribing inside the context makes the store visible to the
    // handler and to every service it awaits.
    const handle = (full: IdempotencyStore) =>
      runInIdempotencyContext(full, () => lastValueFrom(next.handle(), { defaultValue: undefined }));
    if (!meta.external) {
      return this.transactionClaim.run(meta, key, (manager) => handle({ ...store, manager }));
    }
    return this.leaseClaim.run(meta, key, (lease) =>
      handle({
        ...store,
        manager: lease.manager,
        leaseToken: lease.token,
        attempt: lease.attempt,
        extendLease: lease.extend,
      }),
    );
  }

  /** The HTTP error for a failed claim; the handler's own errors pass through. */
  private failure(error: unknown, key: string, response: unknown): unknown {
    if (error instanceof TransactionAbortedError)
      return new InternalServerErrorException(transactionAborted(key));
    if (!(error instanceof ClaimUnavailableError)) return error;
    this.setHeader(response, 'Retry-After', String(this.config.retryAfterSeconds));
    return new ServiceUnavailableException(databaseUnavailable(key));
  }

  private answer(result: ClaimResult<unknown>, key: string, response: unknown): unknown {
    switch (result.kind) {
      case 'processed':
        return result.value;
      case 'replayed':
        this.setHeader(response, REPLAYED_HEADER, 'true');
        return undefined;
      case 'in_flight':
        this.setHeader(response, 'Retry-After', String(result.retryAfterSeconds));
        throw new HttpException(duplicateInFlight(key), this.config.inFlightStatus);
    }
  }

  /** Express and Fastify set headers differently; the adapter knows which. */
  private setHeader(response: unknown, name: string, value: string): void {
    this.adapterHost.httpAdapter.setHeader(response, name, value);
  }

  /** Checks the extracted key; every rejection is a 400 before anything is written. */
  private keyOf(meta: IdempotentWebhookMetadata, request: { body?: unknown }): string {
    let key: unknown;
    try {
      key = meta.key(request.body, request);
    } catch (error) {
      throw new BadRequestException(keyExtractorThrew(meta.scope, error));
    }
    if (typeof key !== 'string') throw new BadRequestException(keyNotString(meta.scope, key));
    if (key.length === 0) throw new BadRequestException(keyEmpty(meta.scope));
    if (key.length > this.config.maxKeyLength) {
      throw new BadRequestException(keyTooLong(meta.scope, key.length, this.config.maxKeyLength));
    }
    // Postgres would refuse it on insert, and a refused claim is a 503 the sender retries forever.
    if (key.includes('\u0000')) throw new BadRequestException(keyHasNul(meta.scope));
    if (LONE_SURROGATE.test(key)) throw new BadRequestException(keyNotWellFormed(meta.scope));
    return key;
  }
}
