import { Catch, Injectable, type ArgumentsHost, type ExceptionFilter } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { IdempotencyError } from '../../idempotency.errors.js';

/** The media type of RFC 9457 problem details, as the Idempotency-Key draft answers its refusals. */
export const PROBLEM_JSON = 'application/problem+json';

/**
 * Answers the library's refusals on an `@IdempotentRequest` route as problem details, with their
 * `application/problem+json` Content-Type, on every Nest major the package supports. Nest's own
 * exception filter would do it on Nest 12, but Nest 11's Express adapter replaces any Content-Type
 * not starting with `application/json` on an error body with `application/json`: so the decorator
 * applies this filter to its route. It writes the answer with the adapter's `reply()` without a
 * status argument (the status is set first), which is the path that keeps the header. The one place
 * that makes them problem details: headers the transport set before (Retry-After) stay. Only the library's errors are caught:
 * everything else goes to the app's filters as before.
 */
@Catch(IdempotencyError)
@Injectable()
export class ProblemDetailsFilter implements ExceptionFilter<IdempotencyError> {
  constructor(private readonly adapterHost: HttpAdapterHost) {}

  catch(error: IdempotencyError, host: ArgumentsHost): void {
    const { httpAdapter } = this.adapterHost;
    const reply = host.getArgByIndex(1);
    httpAdapter.status(reply, error.getStatus());
    httpAdapter.setHeader(reply, 'Content-Type', PROBLEM_JSON);
    httpAdapter.setHeader(reply, 'Content-Language', 'en');
    httpAdapter.reply(reply, error.asProblemDetails().getResponse());
  }
}
