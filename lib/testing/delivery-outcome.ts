import { inspect } from 'node:util';
import { isIdempotencyError } from '../idempotency.errors.js';

/**
 * What one delivery came to, as a sender would see it: `'delivered'` (done, or replayed: do not
 * send it again), `'retry'` (the library said "not now": the event is in flight elsewhere or the
 * database could not record it; send it again later) or `'failed'` (anything else: the handler
 * threw, the request was refused).
 */
export type DeliveryOutcome = 'delivered' | 'retry' | 'failed';

/** How one call of a test's `deliver` ended: it resolved with `value` or rejected with `error`. */
export type SettledDelivery = { resolved: true; value: unknown } | { resolved: false; error: unknown };

/**
 * HTTP answers a sender retries because the library asked it to: 409 (another delivery of the
 * event is in flight), 503 (the database could not record the claim, or a COMMIT was lost), and
 * the two statuses proxies and rate limiters use for "later".
 */
const RETRY_STATUSES: ReadonlySet<number> = new Set([409, 425, 429, 503]);

/** The library's own "deliver again later" errors, as thrown in process or sent to an RPC caller as `code`. */
const RETRY_CODES: ReadonlySet<unknown> = new Set(['IDEMPOTENCY_IN_FLIGHT', 'IDEMPOTENCY_UNAVAILABLE']);

/**
 * The default judge of a delivery, for the three kinds of call a test makes:
 * - an HTTP answer (a supertest or `fetch` Response, a Fastify `inject()` reply: anything with a
 *   numeric `status` or `statusCode`), resolved or thrown (axios throws it as `error.response`):
 *   2xx is delivered, 409/425/429/503 is retry, any other status failed;
 * - a rejection with the library's `EventInFlightError` or `IdempotencyUnavailableError` (an
 *   `@Idempotent` method, `IdempotencyService.run`), or with an RPC error whose `code` is
 *   `IDEMPOTENCY_IN_FLIGHT` or `IDEMPOTENCY_UNAVAILABLE` (`client.send()` of a microservice), or
 *   with a Nest `HttpException` of a retry status: retry;
 * - any other value resolved: delivered; any other rejection: failed.
 *
 * A replayed `@MessagePattern` answers nothing, so `lastValueFrom(client.send(...))` rejects with
 * rxjs' EmptyError: give it a default (`lastValueFrom(reply, { defaultValue: undefined })`).
 */
export function deliveryOutcome(settled: SettledDelivery): DeliveryOutcome {
  if (settled.resolved) {
    const status = httpStatusOf(settled.value);
    return status === undefined ? 'delivered' : statusOutcome(status);
  }
  const { error } = settled;
  if (
    isIdempotencyError(error, 'IDEMPOTENCY_IN_FLIGHT') ||
    isIdempotencyError(error, 'IDEMPOTENCY_UNAVAILABLE')
  ) {
    return 'retry';
  }
  if (isObject(error) && RETRY_CODES.has(error.code)) return 'retry';
  const status = httpStatusOf(error) ?? (isObject(error) ? httpStatusOf(error.response) : undefined);
  return status !== undefined && RETRY_STATUSES.has(status) ? 'retry' : 'failed';
}

/** A short account of how a delivery ended, for the helpers' failure messages. */
export function describeSettled(settled: SettledDelivery): string {
  if (settled.resolved) {
    const status = httpStatusOf(settled.value);
    if (status === undefined) return `resolved with ${brief(settled.value)}`;
    return `answered ${status}${bodyOf(settled.value)}`;
  }
  const { error } = settled;
  const status = isObject(error) ? httpStatusOf(error.response) : undefined;
  if (status !== undefined)
    return `rejected with ${status}${bodyOf((error as { response: unknown }).response)}`;
  const hint =
    error instanceof Error && error.name === 'EmptyError'
      ? ' (an RPC replay answers nothing: give lastValueFrom a defaultValue)'
      : '';
  const text = error instanceof Error ? `${error.name}: ${error.message}` : brief(error);
  return `rejected with ${text}${hint}`;
}

function statusOutcome(status: number): DeliveryOutcome {
  if (status >= 200 && status <= 299) return 'delivered';
  return RETRY_STATUSES.has(status) ? 'retry' : 'failed';
}

/** The HTTP status of an answer, or undefined when `value` does not look like one. */
function httpStatusOf(value: unknown): number | undefined {
  if (!isObject(value)) return undefined;
  for (const status of [value.status, value.statusCode]) {
    if (typeof status === 'number' && Number.isInteger(status) && status >= 100 && status <= 599)
      return status;
  }
  // A Nest HttpException thrown by a direct call.
  if (typeof value.getStatus === 'function') {
    const status: unknown = (value.getStatus as () => unknown).call(value);
    if (typeof status === 'number') return status;
  }
  return undefined;
}

/** The body of an HTTP answer, short: what the handler or the library said. */
function bodyOf(answer: unknown): string {
  if (!isObject(answer)) return '';
  // supertest's `text`, Fastify inject()'s `payload`, axios' `data`; not a fetch Response's stream.
  const body = [answer.text, answer.payload, answer.data, answer.body].find(
    (part) =>
      (typeof part === 'string' && part !== '') || (isPlainObject(part) && Object.keys(part).length > 0),
  );
  return body === undefined ? '' : ` ${brief(body)}`;
}

function brief(value: unknown): string {
  const text = typeof value === 'string' ? value : inspect(value, { depth: 3, breakLength: Infinity });
  return text.length > 300 ? `${text.slice(0, 300)}...` : text;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (!isObject(value)) return false;
  const prototype: unknown = Object.getPrototypeOf(value);
  return prototype === Object.prototype || prototype === null || Array.isArray(value);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null;
}
