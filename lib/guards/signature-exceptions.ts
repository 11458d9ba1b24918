import { BadRequestException, InternalServerErrorException, UnauthorizedException } from '@nestjs/common';
import type { WebhookSignatureError } from './webhook-signature.error.js';

/**
 * The HTTP answers of the signature guards, as classes an exception filter can match with
 * `instanceof`. Each message names the header it is about. Thrown by a guard, so before the
 * interceptor: nothing is claimed or written. The description (the body's `error`) is given: Nest
 * 11 leaves it out when the second argument is an options object, Nest 12 defaults it.
 */

/** 400: the signature header is missing or not in the sender's format. */
export class MalformedSignatureException extends BadRequestException {
  constructor(readonly error: WebhookSignatureError) {
    super(error.message, { cause: error, description: 'Bad Request' });
  }
}

/** 401: the signature does not match the raw body, or its timestamp is outside the tolerance. */
export class InvalidSignatureException extends UnauthorizedException {
  constructor(readonly error: WebhookSignatureError) {
    super(error.message, { cause: error, description: 'Unauthorized' });
  }
}

/**
 * 400: the signature is valid, but the signed body is not an event the sender sends: empty, not
 * JSON (the sender's SDK cannot parse it), or parsed by the platform as another content type.
 */
export class UnreadableBodyException extends BadRequestException {
  constructor(readonly error: WebhookSignatureError) {
    super(error.message, { cause: error, description: 'Bad Request' });
  }
}

/** 400: the request's body is of a content type whose raw bytes Nest does not keep, so it cannot be verified. */
export class UnverifiableBodyException extends BadRequestException {
  constructor(message: string) {
    super(message);
  }
}

/**
 * 500: the server cannot verify any delivery, because the app keeps no raw bodies (`rawBody: true`
 * missing where the boot check could not tell: `bodyParser: false`, or a global guard). A server
 * fault, so never a 401: the sender is not to blame, and retries once it is fixed.
 */
export class RawBodyUnavailableException extends InternalServerErrorException {
  constructor(message: string) {
    super(message);
  }
}
