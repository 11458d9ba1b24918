/**
 * The `nest-idempotent-webhooks/errors` entry: every error class of the library's one family, by
 * value, for a filter that catches one kind (`@Catch(EventInFlightError)`) or code that tells them
 * apart with `instanceof` (which also holds across the package's ESM and CommonJS builds). The
 * root entry has the base class, WebhookSignatureError and `isIdempotencyError(error, code?)`,
 * which narrows to the same classes by code and is enough for most apps.
 */
export {
  EventInFlightError,
  IdempotencyError,
  IdempotencyKeyReusedError,
  IdempotencyOwnerUnknownError,
  IdempotencyUnavailableError,
  InvalidEventOrderError,
  InvalidIdempotencyKeyError,
  isIdempotencyError,
  MissingIdempotencyKeyError,
  PropagationError,
  ResponseNotStoredError,
  TransactionAbortedError,
  UnparsedRequestBodyError,
  type IdempotencyErrorCode,
  type ProblemDetails,
} from '../idempotency.errors.js';
export { WebhookSignatureError, type SignatureFailure } from '../guards/webhook-signature.error.js';
export type { IdempotencyRpcError } from '../transports/rpc/rpc.transport.js';
