import { describe, expect, it } from '@jest/globals';
import { HttpException } from '@nestjs/common';
import * as errorsEntry from '../../lib/errors/index.js';
import * as root from '../../lib/index.js';
import { IdempotencyError, isIdempotencyError, WebhookSignatureError } from '../../lib/index.js';
import {
  EventInFlightError,
  IdempotencyUnavailableError,
  InvalidIdempotencyKeyError,
  PropagationError,
  TransactionAbortedError,
} from '../../lib/errors/index.js';

/** One of each error, as the library makes them. */
const made = {
  invalidKey: new InvalidIdempotencyKeyError('bad key', 'Scope.m', undefined),
  inFlight: new EventInFlightError('in flight', 'Scope.m', 'evt_1', 3),
  inFlight503: new EventInFlightError('in flight', 'Scope.m', 'evt_1', 3, 503),
  unavailable: new IdempotencyUnavailableError('down', 'Scope.m', 'evt_1', 30, '57P01', new Error('gone')),
  aborted: new TransactionAbortedError('aborted', 'Scope.m', 'evt_1'),
  propagation: new PropagationError('never', 'Inner.m', 'evt_1', 'Outer.m'),
  mismatch: new WebhookSignatureError('mismatch', 'Stripe-Signature', 'no match'),
  stale: new WebhookSignatureError('stale', 'Stripe-Signature', 'too old'),
  malformed: new WebhookSignatureError('malformed', 'Stripe-Signature', 'not t=,v1='),
  body: new WebhookSignatureError('body', 'Stripe-Signature', 'empty'),
  unverifiable: new WebhookSignatureError('unverifiable', '', 'text/plain is not kept'),
  noRawBody: new WebhookSignatureError('no_raw_body', '', 'rawBody: true missing'),
};

describe('the library’s errors: one family on every transport', () => {
  it.each(Object.entries(made))(
    '%s is an IdempotencyError and an HttpException with its status',
    (_name, error) => {
      expect(error).toBeInstanceOf(IdempotencyError);
      expect(error).toBeInstanceOf(HttpException);
      expect(error).toBeInstanceOf(Error);
      expect(isIdempotencyError(error)).toBe(true);
      expect(isIdempotencyError(error, error.code)).toBe(true);
    },
  );

  it.each([
    ['invalidKey', 400, { statusCode: 400, message: 'bad key', error: 'Bad Request' }],
    ['inFlight', 409, { statusCode: 409, message: 'in flight' }],
    ['inFlight503', 503, { statusCode: 503, message: 'in flight' }],
    ['unavailable', 503, { statusCode: 503, message: 'down', error: 'Service Unavailable' }],
    ['aborted', 500, { statusCode: 500, message: 'aborted', error: 'Internal Server Error' }],
    ['propagation', 500, { statusCode: 500, message: 'never', error: 'Internal Server Error' }],
    ['mismatch', 401, { statusCode: 401, message: 'no match', error: 'Unauthorized' }],
    ['stale', 401, { statusCode: 401, message: 'too old', error: 'Unauthorized' }],
    ['malformed', 400, { statusCode: 400, message: 'not t=,v1=', error: 'Bad Request' }],
    ['body', 400, { statusCode: 400, message: 'empty', error: 'Bad Request' }],
    ['unverifiable', 400, { statusCode: 400, message: 'text/plain is not kept', error: 'Bad Request' }],
    ['noRawBody', 500, { statusCode: 500, message: 'rawBody: true missing', error: 'Internal Server Error' }],
  ] as const)('%s answers %i with the body Nest has always sent for it', (name, status, body) => {
    expect(made[name].getStatus()).toBe(status);
    expect(made[name].getResponse()).toEqual(body);
  });

  it('has every class on the errors entry, and on the root the base, the signature error and the check', () => {
    const classes = Object.entries(errorsEntry).filter(([, value]) => typeof value === 'function');
    expect(classes.map(([name]) => name).sort()).toEqual([
      'EventInFlightError',
      'IdempotencyError',
      'IdempotencyKeyReusedError',
      'IdempotencyOwnerUnknownError',
      'IdempotencyUnavailableError',
      'InvalidEventOrderError',
      'InvalidIdempotencyKeyError',
      'MissingIdempotencyKeyError',
      'PropagationError',
      'ResponseNotStoredError',
      'TransactionAbortedError',
      'UnparsedRequestBodyError',
      'WebhookSignatureError',
      'isIdempotencyError',
    ]);
    // The same objects on both entries: a filter may import from either.
    expect(root.IdempotencyError).toBe(errorsEntry.IdempotencyError);
    expect(root.WebhookSignatureError).toBe(errorsEntry.WebhookSignatureError);
    expect(root.isIdempotencyError).toBe(errorsEntry.isIdempotencyError);
    expect(Object.keys(root)).not.toContain('EventInFlightError');
  });

  it('tells the errors apart by code, not by the class that made them', () => {
    expect(made.inFlight).not.toBeInstanceOf(IdempotencyUnavailableError);
    expect(made.unavailable).not.toBeInstanceOf(EventInFlightError);
    expect(isIdempotencyError(made.inFlight, 'IDEMPOTENCY_UNAVAILABLE')).toBe(false);
    expect(isIdempotencyError(new Error('a handler’s own'))).toBe(false);
    expect(new Error('a handler’s own')).not.toBeInstanceOf(IdempotencyError);
    // One signature error, its kind in `code` (and `failure`).
    expect(
      [made.mismatch, made.stale, made.malformed, made.body, made.unverifiable, made.noRawBody].map(
        (error) => error.code,
      ),
    ).toEqual([
      'IDEMPOTENCY_SIGNATURE_INVALID',
      'IDEMPOTENCY_SIGNATURE_INVALID',
      'IDEMPOTENCY_SIGNATURE_MALFORMED',
      'IDEMPOTENCY_BODY_UNREADABLE',
      'IDEMPOTENCY_BODY_UNVERIFIABLE',
      'IDEMPOTENCY_RAW_BODY_UNAVAILABLE',
    ]);
    expect(made.unverifiable).toBeInstanceOf(WebhookSignatureError);
    expect(made.inFlight).not.toBeInstanceOf(WebhookSignatureError);
    expect(isIdempotencyError(made.stale, 'IDEMPOTENCY_SIGNATURE_MALFORMED')).toBe(false);
  });

  it('narrows to the code’s class, so its own fields are there', () => {
    const caught: unknown = made.inFlight;
    if (!isIdempotencyError(caught, 'IDEMPOTENCY_IN_FLIGHT')) throw new Error('not in flight');
    // Compiles only if narrowed to EventInFlightError.
    expect(caught.retryAfterSeconds).toBe(3);
    const refused: unknown = made.stale;
    if (!isIdempotencyError(refused, 'IDEMPOTENCY_SIGNATURE_INVALID')) throw new Error('not refused');
    // Compiles only if narrowed to WebhookSignatureError.
    expect([refused.failure, refused.header]).toEqual(['stale', 'Stripe-Signature']);
    const any: unknown = made.unavailable;
    if (!isIdempotencyError(any)) throw new Error('not ours');
    expect(any.scope).toBe('Scope.m');
  });
});
