import { applyDecorators, SetMetadata, UseFilters, UseInterceptors } from '@nestjs/common';
import { resolveClaimSpec } from '../core/claim-options.js';
import { claimOptionType } from '../idempotency.messages.js';
import { IDEMPOTENT_WEBHOOK_METADATA } from '../idempotency.constants.js';
import type { HandlerDecorator, IdempotentRequestOptions } from '../interfaces/index.js';
import { ProblemDetailsFilter } from './http/problem-details.filter.js';
import { requestFingerprint, type RequestMode } from './http/request-mode.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';
import type { IdempotentWebhookMetadata } from './idempotent-webhook.decorator.js';

const badRequestOption = (detail: string) => `@IdempotentRequest ${detail}`;

const notAMethod = (where: string) => `@IdempotentRequest on ${where}: not a method`;

const ownerMissing = (where: string) =>
  `@IdempotentRequest on ${where} needs owner, whose keys they are: a function of the request returning the caller's identity, e.g. { owner: (request) => request.user.id }, so that one caller's key never replays another's response; or owner: false to share keys between every caller of the route`;

/** `@IdempotentRequest`'s options beside the claim's. */
const REQUEST_OPTIONS = [
  'required',
  'owner',
  'strictKeySyntax',
  'fingerprint',
  'replayHeaders',
  'maxStoredResponseBytes',
] as const satisfies readonly (keyof IdempotentRequestOptions)[];

/** The key comes from the header (request-mode.ts): the interceptor reads it there, not through this. */
const headerKey = () => undefined;

/**
 * Makes a route of your own API idempotent for clients that send an `Idempotency-Key` header
 * (the IETF httpapi draft), as Stripe's API is: the first request runs, and its response (status,
 * body, the listed headers) is stored by the same COMMIT as the handler's writes (transaction
 * mode; in external mode by the fenced completion), so a crash leaves neither; a retry is
 * answered that response with `Idempotent-Replayed: true`, without running the handler.
 *
 * ```ts
 * @Post('refunds')
 * @IdempotentRequest({ owner: (request) => request.user.id })
 * async refund(@Body() body: RefundRequest, @Res({ passthrough: true }) response: Response) { ... }
 * ```
 *
 * Typed: `Request` is what `owner` and a `fingerprint` function read
 * (`@IdempotentRequest<AuthenticatedRequest>({ owner: (request) => request.user.id })`, or from
 * `owner`'s own annotation); `Body`, when given, is what the handler's first parameter must accept
 * (`@IdempotentRequest<AuthenticatedRequest, RefundRequest>`). Both are `any` by default.
 *
 * `owner` is required: whose keys they are, or `false` to share them between every caller.
 * Refusals are problem details (`application/problem+json`): no key 400 (`required`), a key
 * reused with another method, URL, Content-Type or body 422, a retry while the first runs 409 +
 * `Retry-After`, a body no parser read 415; none names the owner.
 * They are answered by the route's own filter, ProblemDetailsFilter (the library's errors only: an
 * app's filter for IdempotencyError does not see them on this route), so that the Content-Type
 * holds on Nest 11 too. The route keeps Nest's status (201 for POST). HTTP routes only; streams, SSE and `@Res()`
 * without passthrough fail the boot.
 */
export function IdempotentRequest<Request = any, Body = any>(
  options: IdempotentRequestOptions<Request>,
): HandlerDecorator<Body> {
  const fail = (detail: string) => new TypeError(badRequestOption(detail));
  // JavaScript callers may pass nothing: the missing owner is refused at decoration, naming the method.
  const given: Partial<IdempotentRequestOptions> = options ?? {};
  const {
    required = true,
    owner,
    strictKeySyntax = false,
    fingerprint,
    replayHeaders = ['Location'],
    maxStoredResponseBytes,
  } = given;
  if (typeof required !== 'boolean') throw fail(claimOptionType('required', 'a boolean'));
  if (owner !== undefined && owner !== false && typeof owner !== 'function') {
    throw fail(claimOptionType('owner', 'a function or false'));
  }
  if (typeof strictKeySyntax !== 'boolean') throw fail(claimOptionType('strictKeySyntax', 'a boolean'));
  if (fingerprint !== undefined && fingerprint !== false && typeof fingerprint !== 'function') {
    throw fail(claimOptionType('fingerprint', 'a function or false'));
  }
  if (
    !Array.isArray(replayHeaders) ||
    replayHeaders.some((name) => typeof name !== 'string' || !/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name))
  ) {
    throw fail(claimOptionType('replayHeaders', 'an array of header names'));
  }
  if (
    maxStoredResponseBytes !== undefined &&
    !(Number.isSafeInteger(maxStoredResponseBytes) && maxStoredResponseBytes > 0)
  ) {
    throw fail(
      claimOptionType(
        'maxStoredResponseBytes',
        `a positive whole number, got ${String(maxStoredResponseBytes)}`,
      ),
    );
  }
  const mode: RequestMode = {
    required,
    owner: owner || undefined,
    strictKeySyntax,
    fingerprint,
    replayHeaders: replayHeaders.map((name) => name.toLowerCase()),
    maxStoredResponseBytes,
  };
  return (target, propertyKey, descriptor) => {
    const where = `${target.constructor.name}.${String(propertyKey)}`;
    if (typeof descriptor?.value !== 'function') throw new TypeError(notAMethod(where));
    // After the unknown options: a typo of owner is named as one ("did you mean owner?").
    const spec = resolveClaimSpec('@IdempotentRequest', given, where, REQUEST_OPTIONS);
    if (owner === undefined) throw new TypeError(ownerMissing(where));
    const metadata: IdempotentWebhookMetadata = {
      ...spec,
      // A client can fix its key: a conflict is always refused.
      checks: { conflicts: 'refuse' },
      key: headerKey,
      fingerprint: (_body, httpRequest) => requestFingerprint(mode, httpRequest as never),
      request: mode,
    };
    // No HttpCode: the route answers as Nest would (201 for POST), and a replay answers the same.
    applyDecorators(
      SetMetadata(IDEMPOTENT_WEBHOOK_METADATA, metadata),
      UseInterceptors(IdempotencyInterceptor),
      // Problem details keep their Content-Type on Nest 11's Express adapter too.
      UseFilters(ProblemDetailsFilter),
    )(target, propertyKey, descriptor);
  };
}
