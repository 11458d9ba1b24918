import { Inject, Injectable, type CanActivate, type ExecutionContext } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import type { IdempotencyConfig, WebhookSignatureOptions } from '../interfaces/index.js';
import { readRawBody, type SignedRequest } from './raw-body.js';
import { secretsOf } from './signature-options.js';
import { requireSignedBody, type SignedBodyType } from './signed-body.js';
import { requireHeader } from './webhook-signature.error.js';

const signatureSecretUnset = (guard: string, option: string) =>
  `${guard} has no secret to verify with: set IdempotencyModule option signatures.${option}.secret`;

const signatureGuardNotHttp = (guard: string, type: string) =>
  `${guard} verifies HTTP webhook deliveries; it cannot check a '${type}' execution context`;

/** A header a sender always sends: its lower-case name (as Express and Fastify give it) and its documented spelling. */
export interface SignatureHeader {
  name: string;
  display: string;
}

/**
 * What the four signature guards share: the secret from the module's `signatures` option, the
 * sender's headers checked for presence first (400 naming the header), then the raw body, then
 * the sender's verification, then the signed body (400 when it is not the sender's event); a
 * `WebhookSignatureError` becomes 400 (missing, malformed, body) or 401 (mismatch, stale).
 * Guards run before interceptors, so a refused delivery writes no claim. HTTP only: a
 * microservice context is refused (the boot check already fails such a route).
 */
@Injectable()
export abstract class WebhookSignatureGuard implements CanActivate {
  /** The sender's entry in the module's `signatures` option. */
  protected abstract readonly option: keyof WebhookSignatureOptions;
  /** The headers every delivery of the sender carries; the first is the one the signature is in. */
  protected abstract readonly headers: readonly SignatureHeader[];
  /**
   * The kinds of body the sender signs. A verified delivery that is empty or was parsed as
   * another kind is refused 400: the handler would get `{}` or a form's fields, not the event.
   * `undefined` when `verify()` parses the signed bytes itself (the stripe SDK does).
   * @default ['json']
   */
  protected readonly signedBodies: readonly SignedBodyType[] | undefined = ['json'];

  constructor(
    @Inject(IDEMPOTENCY_CONFIG) protected readonly config: IdempotencyConfig,
    protected readonly adapterHost: HttpAdapterHost,
  ) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    if (context.getType() !== 'http') {
      throw new Error(signatureGuardNotHttp(this.constructor.name, context.getType()));
    }
    const request = context.switchToHttp().getRequest<SignedRequest>();
    const secrets = secretsOf(this.config.signatures?.[this.option]);
    // The boot check fails routes it can see without a secret; a global guard it cannot see gets here.
    if (secrets.length === 0) throw new Error(signatureSecretUnset(this.constructor.name, this.option));
    // A refusal (WebhookSignatureError) is answered as it is: 400 or 401 by its kind.
    for (const { name, display } of this.headers) requireHeader(request.headers[name], display);
    const rawBody = readRawBody(request, this.headers[0].display, this.adapterHost.httpAdapter);
    await this.verify(request, rawBody, secrets);
    if (this.signedBodies) requireSignedBody(request, rawBody, this.headers[0].display, this.signedBodies);
    return true;
  }

  /** Throws a WebhookSignatureError unless `rawBody` carries a valid signature by one of `secrets`. */
  protected abstract verify(
    request: SignedRequest,
    rawBody: Buffer,
    secrets: readonly string[],
  ): void | Promise<void>;
}
