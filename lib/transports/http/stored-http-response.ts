import { Readable } from 'node:stream';
import { StreamableFile } from '@nestjs/common';
import { isObservable } from 'rxjs';
import type { StoredResponse } from '../../core/claim-check.js';
import { ResponseNotStoredError } from '../../idempotency.errors.js';

const bodyTooLarge = (scope: string, bytes: number, max: number) =>
  `${scope} answered a body of ${bytes} bytes, more than maxStoredResponseBytes (${max})`;

const bodyNotJson = (scope: string, what: string) =>
  `${scope} answered ${what}, which cannot be stored for its retries (a request-mode route stores JSON)`;

/** Transaction mode: the request fails, and nothing of it is left. */
const rolledBack = (reason: string) =>
  `${reason}: the request was rolled back, so that no claim is done without its response. Return a smaller JSON body (a Location to read the rest from), or raise maxStoredResponseBytes`;

/** External mode: the work happened; the body is left out. */
export const bodyOmitted = (reason: string) =>
  `${reason}: its body is not stored (external mode: its work has happened and must not run again), and its replays answer its status and headers with an empty body`;

/** The response fields read here; Express's response and Fastify's reply both have them. */
interface HttpResponse {
  statusCode: number;
  getHeader(name: string): unknown;
  /**
   * Node's: the names of the headers set, as they were written (`Location`), which is how Node
   * sends them. Express's response has it; Fastify's reply does not, and sends every name in
   * lower case.
   */
  getRawHeaderNames?(): string[];
}

/** How one response is captured: the route's headers and body cap, and whether its work is done. */
export interface CaptureSettings {
  readonly scope: string;
  readonly key: string;
  readonly replayHeaders: readonly string[];
  readonly maxBodyBytes: number;
  /**
   * External mode: the work has happened, so a body that cannot be stored is left out (its
   * status and headers are kept) rather than failing the request, whose retry would do it again.
   */
  readonly workDone: boolean;
}

/**
 * What a request-mode route answered, to store with its claim: the status Nest has set on the
 * response (the route's default, `@HttpCode`, or the handler's own through
 * `@Res({ passthrough: true })`), the listed headers that are set and the Content-Type if the
 * handler set one, each by the name it was written with, and the returned value's JSON text. The
 * text is stored as it is (a jsonb string keeps it byte for byte) and its replay answers its
 * parse, which Nest serialises to the same text: the same bytes. A body that cannot be stored
 * (over the cap, not JSON) fails the request in transaction mode (ResponseNotStoredError: the
 * claim and the writes roll back), and is left out in external mode (`omitted`, with `onOmitted`
 * told why).
 */
export function captureHttpResponse(
  value: unknown,
  response: HttpResponse,
  settings: CaptureSettings,
  onOmitted: (message: string) => void,
): StoredResponse {
  const headers: Record<string, string | readonly string[]> = {};
  for (const name of settings.replayHeaders) captureHeader(response, name, headers);
  // The Content-Type the handler set (Nest sets its own only as it sends): a replay answers the same.
  if (!settings.replayHeaders.includes('content-type')) captureHeader(response, 'content-type', headers);
  const status = response.statusCode;
  if (value === undefined) return { status, headers };
  if (isStream(value)) {
    const reason = bodyNotJson(settings.scope, describe(value));
    return notStored(status, headers, settings, onOmitted, reason, 'not_json');
  }
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch {
    json = undefined;
  }
  if (json === undefined) {
    const reason = bodyNotJson(settings.scope, 'a value that is not storable JSON');
    return notStored(status, headers, settings, onOmitted, reason, 'not_json');
  }
  const bytes = Buffer.byteLength(json);
  if (bytes > settings.maxBodyBytes) {
    const reason = bodyTooLarge(settings.scope, bytes, settings.maxBodyBytes);
    return notStored(status, headers, settings, onOmitted, reason, 'too_large');
  }
  // The text itself, in a jsonb string: a NUL or a lone surrogate, which jsonb refuses in a value,
  // is an escape in the text (`\u0000`), and text is kept as it is.
  return { status, headers, json };
}

/**
 * Adds the header `name` (lower case) to `headers` if it is set, under the name it was written
 * with. The raw names are read only for a header that is there: each read makes an array.
 */
function captureHeader(
  response: HttpResponse,
  name: string,
  headers: Record<string, string | readonly string[]>,
): void {
  const header = response.getHeader(name);
  if (header === undefined || header === null) return;
  const raw = response
    .getRawHeaderNames?.()
    .find((written) => written.length === name.length && written.toLowerCase() === name);
  // A list stays a list: joined, two Set-Cookies would replay as one cookie with a comma in it.
  headers[raw ?? name] = Array.isArray(header) ? header.map(String) : String(header);
}

/**
 * A body that cannot be stored: the request fails in transaction mode (ResponseNotStoredError),
 * and in external mode, whose work is done, the response is kept without it (`omitted`).
 */
function notStored(
  status: number,
  headers: Record<string, string | readonly string[]>,
  settings: CaptureSettings,
  onOmitted: (message: string) => void,
  message: string,
  omitted: 'too_large' | 'not_json',
): StoredResponse {
  if (!settings.workDone) throw new ResponseNotStoredError(rolledBack(message), settings.scope, settings.key);
  onOmitted(bodyOmitted(message));
  return { status, headers, omitted };
}

/** Bodies Nest streams or sends as bytes: not JSON to store. */
function isStream(value: unknown): boolean {
  return (
    value instanceof StreamableFile ||
    value instanceof Readable ||
    value instanceof Uint8Array ||
    isObservable(value) ||
    (typeof value === 'object' && value !== null && typeof (value as { pipe?: unknown }).pipe === 'function')
  );
}

function describe(value: unknown): string {
  if (value instanceof StreamableFile) return 'a StreamableFile';
  if (value instanceof Uint8Array) return 'a Buffer';
  return 'a stream';
}
