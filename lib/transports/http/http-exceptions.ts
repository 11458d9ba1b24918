/**
 * The names the HTTP answers had when they were exception classes of their own, wrapping the
 * library's errors. Each error is an HttpException now (idempotency.errors.ts), answered over HTTP
 * as it is; these are the same classes under their old names, so `instanceof` and
 * `@Catch(EventInFlightException)` keep working.
 */
export {
  /** @deprecated use EventInFlightError: the same class. */
  EventInFlightError as EventInFlightException,
  /** @deprecated use IdempotencyUnavailableError: the same class. */
  IdempotencyUnavailableError as IdempotencyUnavailableException,
  /** @deprecated use InvalidIdempotencyKeyError: the same class. */
  InvalidIdempotencyKeyError as InvalidIdempotencyKeyException,
  /** @deprecated use TransactionAbortedError: the same class. */
  TransactionAbortedError as TransactionAbortedException,
} from '../../idempotency.errors.js';
