import type { IncomingMessage } from 'node:http';
import {
  BadRequestException,
  Injectable,
  type CanActivate,
  type ExecutionContext,
  type RawBodyRequest,
} from '@nestjs/common';
import Stripe from 'stripe';
import type { SampleConfig } from '../config/sample-config.js';
import { InjectSampleConfig } from '../config/sample-config.module.js';

/** How old a signature may be, in seconds: Stripe's own default. Older deliveries may be replays. */
export const SIGNATURE_TOLERANCE_SECONDS = 300;

/**
 * Lets a request through only if Stripe signed exactly these bytes: `constructEvent` checks the
 * `Stripe-Signature` HMAC over the raw body (Nest `rawBody: true`) and its timestamp, then parses
 * the event. Guards run before interceptors, so a forged, stale or malformed delivery is answered
 * 400 before the idempotency claim writes anything.
 */
/** What the guard reads from Express's request (typed here: the sample needs no @types/express). */
type WebhookRequest = RawBodyRequest<IncomingMessage & { body?: unknown }>;

@Injectable()
export class StripeSignatureGuard implements CanActivate {
  constructor(@InjectSampleConfig() private readonly config: SampleConfig) {}

  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest<WebhookRequest>();
    const signature = request.headers['stripe-signature'];
    if (typeof signature !== 'string' || signature.length === 0) {
      throw new BadRequestException('Missing Stripe-Signature header');
    }
    // Without a JSON content type Express parses nothing and keeps no raw body.
    if (!request.rawBody) throw new BadRequestException('Expected a JSON body');
    try {
      // The handler sees the event parsed from the verified bytes, never anything else.
      request.body = Stripe.webhooks.constructEvent(
        request.rawBody,
        signature,
        this.config.webhookSecret,
        SIGNATURE_TOLERANCE_SECONDS,
      );
    } catch (error) {
      throw new BadRequestException(
        `Invalid Stripe webhook: ${error instanceof Error ? error.message.split('\n')[0] : String(error)}`,
      );
    }
    return true;
  }
}
