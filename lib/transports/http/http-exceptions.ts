import {
  BadRequestException,
  HttpException,
  InternalServerErrorException,
  ServiceUnavailableException,
} from '@nestjs/common';
import type {
  EventInFlightError,
  IdempotencyUnavailableError,
  InvalidIdempotencyKeyError,
  TransactionAbortedError,
} from '../../idempotency.errors.js';

/**
 * The HTTP answers of the library's errors, as classes an exception filter can match with
 * `instanceof`. Each keeps the transport-neutral error as `cause`; the two that ask for a retry
 * carry `retryAfterSeconds`, which the interceptor has already sent as `Retry-After`.
 *
 * The description (the body's `error`) is given, not left to Nest: Nest 12 defaults it when the
 * second argument is an options object, Nest 11 leaves it out, and the body must not depend on it.
 */

/** 400: the key extractor threw or returned an unusable key; nothing was written. */
export class InvalidIdempotencyKeyException extends BadRequestException {
  constructor(readonly error: InvalidIdempotencyKeyError) {
    super(error.message, { cause: error, description: 'Bad Request' });
  }
}

/** 409 (or `inFlightStatus`: 503) + Retry-After: another delivery of the event is being processed. */
export class EventInFlightException extends HttpException {
  readonly retryAfterSeconds: number;

  constructor(
    readonly error: EventInFlightError,
    status: 409 | 503,
  ) {
    super(error.message, status, { cause: error });
    this.retryAfterSeconds = error.retryAfterSeconds;
  }
}

/** 503 + Retry-After: the database could not record the claim or its outcome. */
export class IdempotencyUnavailableException extends ServiceUnavailableException {
  readonly retryAfterSeconds: number;

  constructor(readonly error: IdempotencyUnavailableError) {
    super(error.message, { cause: error, description: 'Service Unavailable' });
    this.retryAfterSeconds = error.retryAfterSeconds;
  }
}

/** 500: the handler went on after a failed statement, so PostgreSQL rolled the COMMIT back. */
export class TransactionAbortedException extends InternalServerErrorException {
  constructor(readonly error: TransactionAbortedError) {
    super(error.message, { cause: error, description: 'Internal Server Error' });
  }
}
