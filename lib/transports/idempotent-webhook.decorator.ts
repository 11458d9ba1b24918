import { applyDecorators, HttpCode, SetMetadata, UseGuards, UseInterceptors } from '@nestjs/common';
import { resolveClaimSpec } from '../core/claim-options.js';
import type { ClaimSpec } from '../core/claim-strategy.js';
import { resolveEventOrder, type EventOrderSpec } from '../core/event-order.js';
import { FINGERPRINT_PRESETS, webhookFingerprint, type FingerprintOf } from '../keys/webhook-fingerprints.js';
import { SIGNATURE_GUARDS, signatureGuardNamed } from '../guards/signature-guards.js';
import { IDEMPOTENT_WEBHOOK_METADATA } from '../idempotency.constants.js';
import { missingKeyFunction } from '../idempotency.messages.js';
import type {
  HandlerDecorator,
  IdempotencyKeyExtractor,
  IdempotentWebhookOptions,
} from '../interfaces/index.js';
import type { RequestMode } from './http/request-mode.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';

const unknownSignatureName = (value: unknown, known: readonly string[]) =>
  `@IdempotentWebhook option signature must be one of ${known.map((name) => `'${name}'`).join(', ')}, got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

const unknownFingerprint = (value: unknown) =>
  `@IdempotentWebhook option fingerprint must be one of ${FINGERPRINT_PRESETS.map((name) => `'${name}'`).join(', ')}, a function or false, got ${typeof value === 'string' ? `'${value}'` : String(value)}`;

const unknownConflictAnswer = (value: unknown) =>
  `@IdempotentWebhook option onKeyConflict must be 'replay' or 'refuse', got ${String(value)}`;

const notAMethod = (where: string) => `@IdempotentWebhook on ${where}: not a method`;

/** `@IdempotentWebhook`'s options beside the claim's. */
const WEBHOOK_OPTIONS = [
  'key',
  'signature',
  'fingerprint',
  'onKeyConflict',
  'order',
] as const satisfies readonly (keyof IdempotentWebhookOptions)[];

/**
 * What the decorator stores: the claim spec, resolved once, and the key extractor. `@IdempotentRequest`
 * stores the same, with `request`.
 */
export interface IdempotentWebhookMetadata extends ClaimSpec {
  key: IdempotencyKeyExtractor;
  /** Key checks: the delivery's fingerprint of `(body, request)`; undefined: none is stored. */
  fingerprint?: FingerprintOf;
  /** Request mode (`@IdempotentRequest`): the key from the header, responses stored and replayed. */
  request?: RequestMode;
  /** The ordering guard (`order`), resolved once; undefined without one. */
  order?: EventOrderSpec;
}

/**
 * Makes a controller handler safe under at-least-once delivery: every event has exactly one
 * visible effect. For HTTP routes (it answers 200: webhook senders expect 200, Nest answers POST
 * with 201) and for `@EventPattern` / `@MessagePattern` microservice handlers. Alone it is
 * enough: it applies the interceptor.
 *
 * ```ts
 * @Post('stripe')
 * @IdempotentWebhook({ key: (event) => event.id })
 * handle(@Body() event: Stripe.Event, @WebhookTransaction() manager: EntityManager) { ... }
 *
 * @EventPattern('order.paid')
 * @IdempotentWebhook<OrderPaid>({ key: (data) => data.eventId })
 * onPaid(@Payload() data: OrderPaid) { ... }
 * ```
 *
 * Typed by the handler: `Event` is its first parameter's type (`event` above is a `Stripe.Event`,
 * so `event.idd` does not compile), or the one given (`@IdempotentWebhook<OrderPaid>(...)`), which
 * the first parameter must then accept. `key`, a `fingerprint` function and `order` read it; a
 * key annotated with a type of its own must accept it too. A handler whose first parameter is not
 * the event (`handle(@Req() request, @Body() event)`) gives `<any>`, or its event type with the
 * event first. A handler of no parameter, or whose first is `any`, checks nothing.
 *
 * Transaction mode (default): write through the transaction's manager; claim and writes commit
 * together. `mode: 'external'` (or `external: true`): a lease claim for work outside the database.
 * For provider methods no interceptor reaches (queue consumers, cron jobs), use `@Idempotent`.
 * `signature: 'stripe' | 'github' | 'standard-webhooks' | 'shopify'` also applies that sender's
 * signature guard (HTTP routes only), which runs before the claim. `order` adds the ordering
 * guard: an event older than the version its entity has is not applied (docs/ordering.md).
 */
export function IdempotentWebhook<Event = any, Request = any>(
  // NoInfer: Event is the handler's, so a key annotated with a type of its own is checked against
  // it rather than deciding it.
  options: IdempotentWebhookOptions<NoInfer<Event>, Request>,
): HandlerDecorator<Event> {
  if (typeof options?.key !== 'function') throw new TypeError(missingKeyFunction('@IdempotentWebhook'));
  const { key } = options;
  const signatureGuard = signatureGuardNamed(options.signature);
  if (options.signature !== undefined && !signatureGuard) {
    throw new TypeError(
      unknownSignatureName(
        options.signature,
        SIGNATURE_GUARDS.map((entry) => entry.name),
      ),
    );
  }
  const fingerprint = webhookFingerprint(options.fingerprint, options.signature, key);
  if (fingerprint === undefined) throw new TypeError(unknownFingerprint(options.fingerprint));
  const { onKeyConflict = 'replay' } = options;
  if (onKeyConflict !== 'replay' && onKeyConflict !== 'refuse') {
    throw new TypeError(unknownConflictAnswer(onKeyConflict));
  }
  return (target, propertyKey, descriptor) => {
    const where = `${target.constructor.name}.${String(propertyKey)}`;
    if (typeof descriptor?.value !== 'function') throw new TypeError(notAMethod(where));
    const spec = resolveClaimSpec('@IdempotentWebhook', options, where, WEBHOOK_OPTIONS);
    // Key checks on every webhook: fingerprints stored with the claims, conflicts answered as
    // onKeyConflict says, and a @MessagePattern's reply stored for its replays.
    const metadata: IdempotentWebhookMetadata = {
      ...spec,
      checks: { conflicts: onKeyConflict === 'refuse' ? 'refuse' : 'warn' },
      key,
      ...(fingerprint ? { fingerprint } : {}),
    };
    if (options.order !== undefined) {
      metadata.order = resolveEventOrder('@IdempotentWebhook', options.order, spec);
    }
    applyDecorators(
      SetMetadata(IDEMPOTENT_WEBHOOK_METADATA, metadata),
      UseInterceptors(IdempotencyInterceptor),
      HttpCode(200),
      ...(signatureGuard ? [UseGuards(signatureGuard)] : []),
    )(target, propertyKey, descriptor);
  };
}
