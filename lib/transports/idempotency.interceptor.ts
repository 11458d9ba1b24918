import {
  Inject,
  Injectable,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { Observable } from 'rxjs';
import { AnsweredFailure } from '../core/answered-failure.js';
import type { ClaimCheck } from '../core/claim-check.js';
import { claimRefusal, isRefused } from '../core/claim-refusal.js';
import { extractEventOrder, type EventOrder } from '../core/event-order.js';
import { ClaimRunner } from '../core/claim-runner.js';
import { IDEMPOTENCY_CONFIG, IDEMPOTENT_WEBHOOK_METADATA } from '../idempotency.constants.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import { ACKNOWLEDGE, webhookKey, type DeliveryTransport } from './delivery-transport.js';
import { HttpTransport } from './http/http.transport.js';
import type { IdempotentWebhookMetadata } from './idempotent-webhook.decorator.js';
import { KeyFindings } from './key-findings.js';
import { RpcTransport } from './rpc/rpc.transport.js';

const unsupportedContext = (scope: string, type: string) =>
  `@IdempotentWebhook on ${scope} cannot protect a '${type}' execution context; the handler was not run`;

/**
 * A delivery's fingerprint, or null when it cannot be made (a function of the app's that throws, a
 * value that cannot be serialised): the key checks then compare nothing, and the delivery runs as
 * it would without them, rather than fail for a check.
 */
function fingerprintOf(
  fingerprint: (body: unknown, request: unknown) => string | null,
  args: readonly unknown[],
) {
  try {
    return fingerprint(args[0], args[1]);
  } catch {
    return null;
  }
}

/**
 * Applied by `@IdempotentWebhook` and `@IdempotentRequest`: extracts and checks the key (and the
 * delivery's fingerprint), runs the handler through the claim in the delivery's context, and has
 * the context's transport (HTTP, RPC) answer the outcome, storing what it answered where the
 * transport keeps responses for replays. A context no transport serves is refused, never passed
 * through: the explorer already fails the boot for those, and this is the last line.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  constructor(
    private readonly reflector: Reflector,
    private readonly runner: ClaimRunner,
    private readonly http: HttpTransport,
    private readonly rpc: RpcTransport,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly findings: KeyFindings,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    const meta = this.reflector.get<IdempotentWebhookMetadata | undefined>(
      IDEMPOTENT_WEBHOOK_METADATA,
      context.getHandler(),
    );
    if (!meta) return next.handle(); // applied by hand to a route without the decorator
    const transport = this.transportFor(context);
    if (!transport) throw new Error(unsupportedContext(meta.scope, context.getType()));
    // A plain Observable over the claim's promise: rxjs' defer() and from() would add promises of
    // their own to every delivery, and each pays AsyncLocalStorage's hooks.
    return new Observable((subscriber) => {
      let key: string | undefined;
      let check: ClaimCheck | undefined;
      // The ordering guard's entity and version, read from the key's arguments and checked as the
      // key is: a bad one is refused before the claim, writing nothing.
      let order: EventOrder | undefined;
      try {
        const { maxKeyLength } = this.config;
        const read = transport.claimKey
          ? transport.claimKey(context, meta)
          : webhookKey(transport.keyArguments(context), meta, maxKeyLength);
        key = read?.key;
        if (read !== undefined && meta.order) {
          order = extractEventOrder(meta.scope, read.key, meta.order, read.args, maxKeyLength);
        }
        if (read !== undefined && meta.checks) {
          const fingerprint = meta.fingerprint ? fingerprintOf(meta.fingerprint, read.args) : null;
          const { storesResponse } = read;
          check = { fingerprint, refuse: meta.checks.conflicts === 'refuse', storesResponse };
          // A webhook's key that changes between copies (request keys are the client's own).
          if (!storesResponse) this.findings.observe(meta.scope, read.key, fingerprint);
        }
      } catch (error) {
        const failure = transport.failure(error, context, meta);
        if (failure === ACKNOWLEDGE) subscriber.complete();
        else subscriber.error(failure);
        return;
      }
      // A request-mode route that does not require the header runs without a claim.
      if (key === undefined) return next.handle().subscribe(subscriber);
      const claimKey = key;
      // next.handle() is cold: subscribing inside the delivery's context makes it visible to the
      // handler and to every service it awaits.
      this.runner
        .execute(
          meta,
          claimKey,
          (delivery) =>
            // The handler's last value, as lastValueFrom() would give it, from one promise: an
            // async function awaiting lastValueFrom() makes three, each paying AsyncLocalStorage.
            new Promise<unknown>((resolve, reject) => {
              let value: unknown;
              next.handle().subscribe({
                next: (emitted) => {
                  value = emitted;
                },
                error: reject,
                complete: () => {
                  try {
                    // A failure answered rather than thrown (an HTTP 5xx) fails the delivery too.
                    const failed = transport.answeredFailure?.(context);
                    if (failed !== undefined) {
                      reject(new AnsweredFailure(meta.scope, failed, value));
                      return;
                    }
                    // Key checks: what the transport keeps for replays, stored with the claim.
                    const response = check && transport.capture?.(value, context, meta, claimKey);
                    if (response) delivery.recordResponse(response);
                    resolve(value);
                  } catch (error) {
                    reject(error);
                  }
                },
              });
            }),
          // The context is the delivery's origin, read for its span only when tracing is on.
          { check, order, origin: context },
        )
        .then(
          (result) => {
            // A conflict refused ('refuse') is reported as one; one let through ('warn') rides on
            // the result of the claim that ran anyway.
            if (result.kind === 'conflict') this.findings.conflict(meta.scope, claimKey, result.state, true);
            else if (result.conflict) this.findings.conflict(meta.scope, claimKey, result.conflict, false);
            if (isRefused(result)) {
              const refusal = claimRefusal(result, meta.scope, claimKey, this.config);
              subscriber.error(transport.failure(refusal, context, meta));
              return;
            }
            let value: unknown;
            try {
              value = transport.answer(result, context, meta);
            } catch (error) {
              subscriber.error(error);
              return;
            }
            subscriber.next(value);
            subscriber.complete();
          },
          (error: unknown) => {
            // Rolled back (or marked failed) for its 5xx: the caller gets the handler's own answer.
            if (error instanceof AnsweredFailure) {
              subscriber.next(error.value);
              subscriber.complete();
              return;
            }
            subscriber.error(transport.failure(error, context, meta));
          },
        );
    });
  }

  /**
   * The transport for `context`, or undefined when none serves it. Override it to serve another
   * context type (`ws`, `graphql`) with your own DeliveryTransport.
   */
  protected transportFor(context: ExecutionContext): DeliveryTransport | undefined {
    const type = context.getType();
    if (type === 'http') return this.http;
    if (type === 'rpc') return this.rpc;
    return undefined;
  }
}
