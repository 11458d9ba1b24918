import { Injectable } from '@nestjs/common';
import { loadOptionalPeer } from '../core/optional-peer.js';
import {
  headerMalformed,
  signatureMismatch,
  signatureTooNew,
  signatureTooOld,
} from '../idempotency.messages.js';
import type { SignedRequest } from './raw-body.js';
import { DEFAULT_TOLERANCE_SECONDS } from './signature-options.js';
import { signedBodyEmpty, signedBodyNotJson } from './signed-body.js';
import { requireHeader, WebhookSignatureError } from './webhook-signature.error.js';
import { WebhookSignatureGuard } from './webhook-signature.guard.js';

/** Stripe's signature header, as its documentation spells it. */
export const STRIPE_SIGNATURE_HEADER = 'Stripe-Signature';

/**
 * The part of the stripe SDK used here (`Stripe.webhooks`), typed locally so that the library's
 * declarations do not need the SDK's: stripe is an optional peer dependency.
 */
export interface StripeWebhooksApi {
  constructEvent(payload: Buffer | string, header: string, secret: string, tolerance?: number): unknown;
}

/** What loading the stripe package gives: its ES module namespace, or its CommonJS exports. */
interface StripeSdk {
  default?: { webhooks?: StripeWebhooksApi };
  webhooks?: StripeWebhooksApi;
}

let stripeWebhooks: Promise<StripeWebhooksApi> | undefined;

/**
 * The stripe SDK's `webhooks`, imported on first use (the boot check calls this when a route is
 * guarded by StripeSignatureGuard), so apps without stripe still load the library. A failed
 * import stays failed: installing the package needs a restart anyway.
 */
export function loadStripeWebhooks(): Promise<StripeWebhooksApi> {
  stripeWebhooks ??= loadOptionalPeer<StripeSdk>('stripe').then((sdk) => {
    // Imported (ESM), the SDK's class is the module's default export; required (CommonJS), it is
    // the module itself.
    const webhooks = sdk.default?.webhooks ?? sdk.webhooks;
    if (typeof webhooks?.constructEvent !== 'function') {
      throw new Error('the stripe package has no webhooks.constructEvent');
    }
    return webhooks;
  });
  return stripeWebhooks;
}

/** `t=<unix seconds>` and at least one `v1=<64 hex>`; other schemes (`v0`, test-mode) are allowed and ignored. */
function parseStripeHeader(header: string): { timestamp: number } {
  let timestamp: number | undefined;
  let v1 = 0;
  let malformed = false;
  for (const item of header.split(',')) {
    const equals = item.indexOf('=');
    const name = item.slice(0, equals);
    const value = item.slice(equals + 1);
    if (equals <= 0) malformed = true;
    else if (name === 't') {
      if (/^\d{1,15}$/.test(value)) timestamp = Number(value);
      else malformed = true;
    } else if (name === 'v1') {
      if (/^[0-9a-f]{64}$/i.test(value)) v1++;
      else malformed = true;
    }
  }
  if (malformed || timestamp === undefined || v1 === 0) {
    throw new WebhookSignatureError(
      'malformed',
      STRIPE_SIGNATURE_HEADER,
      headerMalformed(STRIPE_SIGNATURE_HEADER, 't=<timestamp>,v1=<hex signature>'),
    );
  }
  return { timestamp };
}

/** The SDK's own error for a refused signature (its class is not imported: the SDK is optional). */
function isStripeVerificationError(error: unknown): error is Error {
  return error instanceof Error && (error as { type?: unknown }).type === 'StripeSignatureVerificationError';
}

/**
 * Stripe's check, by the stripe SDK: `webhooks.constructEvent` verifies the `Stripe-Signature`
 * HMAC over the raw body and that its timestamp is at most `toleranceSeconds` old, then parses the
 * event, which is returned. The header's shape is checked first, so a malformed header is told
 * apart (400) from a signature that does not match (401). With several secrets (rotation), a
 * delivery signed under any of them passes.
 *
 * Two checks the SDK leaves out are made here, once a secret matched. A timestamp more than
 * `toleranceSeconds` in the future is refused as `stale` (the SDK only checks age, so a
 * signature dated ahead would stay replayable until that time came and went). And a body the SDK
 * cannot parse (empty, a form, UTF-16: the SDK reads the bytes as UTF-8 JSON) is a `body`
 * failure, answered 400 naming the problem, not the SDK's SyntaxError as a 500 the sender would
 * retry for days. Other errors (a thin v2 event notification sent to this endpoint) are rethrown
 * as they are.
 */
export function verifyStripeSignature(
  webhooks: StripeWebhooksApi,
  rawBody: Buffer,
  header: unknown,
  secrets: readonly string[],
  toleranceSeconds: number = DEFAULT_TOLERANCE_SECONDS,
): unknown {
  const value = requireHeader(header, STRIPE_SIGNATURE_HEADER);
  const { timestamp } = parseStripeHeader(value);
  const now = Math.floor(Date.now() / 1000);
  let stale = false;
  let detail: string | undefined;
  for (const secret of secrets) {
    let event: unknown;
    try {
      event = webhooks.constructEvent(rawBody, value, secret, toleranceSeconds);
    } catch (error) {
      // The SDK parses (JSON.parse) only after it verified the signature and its age: this
      // secret matched. By name: the SDK's JSON may come from another realm (vm contexts).
      if (error instanceof Error && error.name === 'SyntaxError')
        return refuseUnparsedBody(rawBody, timestamp, now, toleranceSeconds, error);
      if (!isStripeVerificationError(error)) throw error;
      // The SDK checks the signature before the timestamp: a tolerance error means this secret matched.
      if (/tolerance/i.test(error.message)) stale = true;
      else detail ??= `stripe: ${error.message.split('\n')[0].trim()}`;
      continue;
    }
    refuseFuture(timestamp, now, toleranceSeconds);
    return event;
  }
  if (stale) {
    throw new WebhookSignatureError(
      'stale',
      STRIPE_SIGNATURE_HEADER,
      signatureTooOld(STRIPE_SIGNATURE_HEADER, now - timestamp, toleranceSeconds),
    );
  }
  throw new WebhookSignatureError(
    'mismatch',
    STRIPE_SIGNATURE_HEADER,
    signatureMismatch(STRIPE_SIGNATURE_HEADER, 'the raw request body', detail),
  );
}

/** Refuses a verified signature dated more than `toleranceSeconds` after `now`. */
function refuseFuture(timestamp: number, now: number, toleranceSeconds: number): void {
  const ahead = timestamp - now;
  if (ahead > toleranceSeconds) {
    throw new WebhookSignatureError(
      'stale',
      STRIPE_SIGNATURE_HEADER,
      signatureTooNew(STRIPE_SIGNATURE_HEADER, ahead, toleranceSeconds),
    );
  }
}

/** A verified signature over bytes the SDK could not parse: the time is checked first, as for a parsed one. */
function refuseUnparsedBody(
  rawBody: Buffer,
  timestamp: number,
  now: number,
  toleranceSeconds: number,
  error: Error,
): never {
  refuseFuture(timestamp, now, toleranceSeconds);
  throw new WebhookSignatureError(
    'body',
    STRIPE_SIGNATURE_HEADER,
    rawBody.length === 0
      ? signedBodyEmpty(STRIPE_SIGNATURE_HEADER)
      : signedBodyNotJson(STRIPE_SIGNATURE_HEADER, error.message),
  );
}

/**
 * Lets a Stripe delivery through only if the stripe SDK accepts its `Stripe-Signature` under
 * `signatures.stripe.secret`, its timestamp is within `toleranceSeconds` (default 300, Stripe's
 * own) either way, and the SDK can parse the signed body:
 * `@UseGuards(StripeSignatureGuard)` or `@IdempotentWebhook({ key: stripeEventKey, signature:
 * 'stripe' })`. The handler's body becomes the event the SDK parsed from the verified bytes.
 * Needs `rawBody: true` and the `stripe` package (an optional peer dependency; the boot fails
 * without it when a route uses this guard).
 */
@Injectable()
export class StripeSignatureGuard extends WebhookSignatureGuard {
  protected readonly option = 'stripe';
  protected readonly headers = [{ name: 'stripe-signature', display: STRIPE_SIGNATURE_HEADER }];
  // The SDK parses the signed bytes itself, whatever the content type; the handler gets its parse.
  protected override readonly signedBodies = undefined;

  protected async verify(request: SignedRequest, rawBody: Buffer, secrets: readonly string[]): Promise<void> {
    const webhooks = await loadStripeWebhooks();
    request.body = verifyStripeSignature(
      webhooks,
      rawBody,
      request.headers['stripe-signature'],
      secrets,
      this.config.signatures?.stripe?.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS,
    );
  }
}
