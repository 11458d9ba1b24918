import { parseItem } from 'structured-headers';
import { checkIdempotencyKey, MAX_CLAIM_KEY_BYTES } from '../../core/idempotency-key.js';
import {
  IdempotencyOwnerUnknownError,
  InvalidIdempotencyKeyError,
  MissingIdempotencyKeyError,
  UnparsedRequestBodyError,
} from '../../idempotency.errors.js';
import { describeError } from '../../idempotency.messages.js';
import { sha256Hex } from '../../keys/webhook-fingerprints.js';

/** The request header of the IETF httpapi draft. */
export const IDEMPOTENCY_KEY_HEADER = 'Idempotency-Key';

const keyMissing = (scope: string) =>
  `${scope} is idempotent and requires an ${IDEMPOTENCY_KEY_HEADER} header: send one, the same on every retry of this request`;

const keyMalformed = (scope: string, strict: boolean, reason: string) =>
  `${IDEMPOTENCY_KEY_HEADER} of ${scope} must be a quoted string, as the IETF draft writes it (${IDEMPOTENCY_KEY_HEADER}: "8e03978e-40d5-43e8-bc93-6894a57f9324")${strict ? '' : ', or a bare key of visible ASCII without spaces, double quotes or commas'}: ${reason}`;

const ownerUnknown = (scope: string, got: string) =>
  `${scope} scopes its idempotency keys to their owner, and owner() ${got} for this request; refuse unauthenticated requests with a guard, which runs before the claim`;

const bodyUnparsed = (scope: string, mediaType: string) =>
  `${scope} tells a retry from another request by the bytes of its body, and no body parser read this one (Content-Type: ${mediaType || 'none'}); nothing ran. Send a Content-Type the API takes. For the app: register a parser for the type (app.useBodyParser(), e.g. 'text' or 'raw' with { type } on Express; a type or RegExp on Fastify), or give @IdempotentRequest a fingerprint function of its own`;

/**
 * An sf-string with no escape and no parameter, the whole header: what clients send (a UUID in
 * quotes). Its characters are those RFC 9651 allows unescaped in a string (and `%`), so it is
 * read here as structured-headers reads it, without the parser (0.55 -> 0.13 µs a request);
 * anything else, a parameter, an escape or something that is no string, goes to the parser.
 */
const PLAIN_SF_STRING = /^"([\x20\x21\x23-\x5b\x5d-\x7e]*)"$/;

/**
 * A bare key, the header's whole value: visible ASCII but the double quote (an sf-string starts
 * with one), the comma (Node joins a repeated header with ", ": two keys must not read as one)
 * and the space. What most clients send (a bare UUID, base64url) and both peers accept; no
 * sf-string matches it, so it is tried only after PLAIN_SF_STRING, before the parser.
 */
const BARE_KEY = /^[\x21\x23-\x2b\x2d-\x7e]+$/;

/**
 * The longest owner a claim's key holds as it is (URI-encoded): the 255 characters earlier
 * releases allowed an owner, so that every claim they stored still matches its retries (a form
 * that changed would run a retry again). A longer owner, which they refused, is hashed.
 */
const MAX_PLAIN_OWNER_LENGTH = 255;

/** What `@IdempotentRequest` resolves for a route, once, and the HTTP transport reads. */
export interface RequestMode {
  /** A request without the header is refused (else it runs without a claim). */
  readonly required: boolean;
  /** The caller's identity, part of the claim's key; undefined with `owner: false` (shared keys). */
  readonly owner?: (request: any) => unknown;
  /** Only the draft's quoted sf-string; else a bare key too. */
  readonly strictKeySyntax: boolean;
  /** The route's own fingerprint function, false for none, undefined for the default. */
  readonly fingerprint?: false | ((request: any) => unknown);
  /** Response headers stored and replayed, lower-case. */
  readonly replayHeaders: readonly string[];
  /** The route's body cap; undefined: the module's. */
  readonly maxStoredResponseBytes?: number;
}

/** The request fields read here; the same on Express's request and Fastify's. */
interface KeyedRequest {
  headers: Record<string, string | string[] | undefined>;
  method?: string;
  originalUrl?: string;
  url?: string;
  rawBody?: unknown;
  body?: unknown;
  /** Node's request is the request itself on Express; Fastify's holds it as `raw`. */
  readableEnded?: boolean;
  raw?: { readableEnded?: boolean };
}

/**
 * The claim's key of a request: the `Idempotency-Key` header, an sf-string (RFC 9651, parsed by
 * structured-headers; parameters are allowed and ignored, as for any item) or, unless
 * `strictKeySyntax`, a bare key, checked as every key is, and prefixed with its owner when the
 * route has one: `<owner part>:<key>` (see ownedKey), which no other owner's key can equal
 * (an owner part holds no colon). Undefined when the header is missing on a route that does not
 * require it (the request then runs without a claim). With the default fingerprint, a body no
 * parser read is refused here (415), before any claim: its fingerprint would see nothing of it.
 */
export function requestIdempotencyKey(
  scope: string,
  mode: RequestMode,
  request: KeyedRequest,
  maxKeyLength: number,
): string | undefined {
  const header = request.headers[IDEMPOTENCY_KEY_HEADER.toLowerCase()];
  if (header === undefined) {
    if (!mode.required) return undefined;
    throw new MissingIdempotencyKeyError(keyMissing(scope), scope);
  }
  // Node joins a repeated header with ", ": two keys are one malformed list, refused below.
  const raw = Array.isArray(header) ? header.join(', ') : header;
  let value: unknown = PLAIN_SF_STRING.exec(raw)?.[1];
  if (value === undefined && !mode.strictKeySyntax && BARE_KEY.test(raw)) value = raw;
  if (value === undefined) {
    try {
      [value] = parseItem(raw);
    } catch (error) {
      throw new InvalidIdempotencyKeyError(
        keyMalformed(scope, mode.strictKeySyntax, describeError(error)),
        scope,
        undefined,
      );
    }
  }
  if (typeof value !== 'string') {
    throw new InvalidIdempotencyKeyError(
      keyMalformed(scope, mode.strictKeySyntax, `got ${raw}`),
      scope,
      undefined,
    );
  }
  const key = checkIdempotencyKey(scope, value, maxKeyLength);
  if (mode.fingerprint === undefined && bodyUnread(request)) {
    const type = mediaType(request.headers['content-type']);
    throw new UnparsedRequestBodyError(bodyUnparsed(scope, type), scope, type);
  }
  if (!mode.owner) return key;
  return ownedKey(scope, requestOwner(scope, mode.owner, request), key);
}

/**
 * The claim's key of `key` for `owner`: `<owner, URI-encoded>:<key>` for an owner of at most 255
 * characters, as earlier releases stored it; else `sha256=<hex>:<key>`, the SHA-256 of the
 * owner's UTF-16 code units, 71 characters whatever its length. Hashed too: an owner with a lone
 * surrogate (no URI encoding), and one whose encoding (up to 9 characters a character) would not
 * fit the claims table's index beside its scope and key (MAX_CLAIM_KEY_BYTES: its claim could
 * never be stored, so none was). The plain form never holds a `=` (nor a colon), so no hash form
 * equals one; code units, not UTF-8, are hashed so that owners differing only in a lone surrogate
 * (which UTF-8 would turn into the same U+FFFD) stay apart.
 */
function ownedKey(scope: string, owner: string, key: string): string {
  if (owner.length <= MAX_PLAIN_OWNER_LENGTH) {
    let plain: string | undefined;
    try {
      plain = encodeURIComponent(owner);
    } catch {
      // URIError: a lone surrogate, which the hash form takes.
    }
    if (plain !== undefined) {
      const claimKey = `${plain}:${key}`;
      // A UTF-16 code unit is at most 3 bytes of UTF-8 (the plain form is ASCII): counted only
      // when that bound does not settle it.
      const roomy = (scope.length + key.length) * 3 + plain.length + 1 <= MAX_CLAIM_KEY_BYTES;
      if (roomy || Buffer.byteLength(scope) + Buffer.byteLength(claimKey) <= MAX_CLAIM_KEY_BYTES) {
        return claimKey;
      }
    }
  }
  return `sha256=${sha256Hex(Buffer.from(owner, 'utf16le'))}:${key}`;
}

/**
 * The key as the client sent it, from the claim's: without its owner part on a route with owners
 * (the part holds no colon, so the key is what follows the first). What answers name.
 */
export function clientKey(mode: RequestMode, claimKey: string): string {
  return mode.owner ? claimKey.slice(claimKey.indexOf(':') + 1) : claimKey;
}

/** The request's owner, a non-empty string, or IdempotencyOwnerUnknownError. */
function requestOwner(scope: string, owner: (request: any) => unknown, request: KeyedRequest): string {
  let value: unknown;
  try {
    value = owner(request);
  } catch (error) {
    throw new IdempotencyOwnerUnknownError(ownerUnknown(scope, `threw: ${describeError(error)}`), scope);
  }
  const text = typeof value === 'number' && Number.isFinite(value) ? String(value) : value;
  if (typeof text !== 'string' || text.length === 0) {
    const got = typeof text === 'string' ? 'returned an empty string' : `returned ${String(value)}`;
    throw new IdempotencyOwnerUnknownError(ownerUnknown(scope, got), scope);
  }
  return text;
}

/**
 * True when the request has a body (a Content-Length above 0, or a Transfer-Encoding) that no
 * parser read: no raw body, no text or bytes, and Node's stream not read to its end. Express
 * leaves a type it has no parser for unread (its body undefined, or `{}` on Express 4), as does
 * Fastify a type whose parser leaves the stream to the handler (`@fastify/multipart`); Fastify
 * refuses a type it has no parser for itself (415), before the route. The library does not read
 * the stream itself: the handler, or an interceptor after this one, may be the one that does.
 */
function bodyUnread(request: KeyedRequest): boolean {
  const { body } = request;
  if (request.rawBody instanceof Uint8Array || typeof body === 'string' || body instanceof Uint8Array) {
    return false;
  }
  const { headers } = request;
  const length = headers['content-length'];
  if (headers['transfer-encoding'] === undefined && !(Number(length) > 0)) return false;
  return (request.raw ?? request).readableEnded === false;
}

/** A Content-Type's media type, lower-case, without parameters or spaces; empty for none. */
function mediaType(header: string | string[] | undefined): string {
  if (typeof header !== 'string') return '';
  // What JSON clients send, as it is: no slice, no lower-casing on the route's usual request.
  if (header === 'application/json') return header;
  const semicolon = header.indexOf(';');
  return (semicolon === -1 ? header : header.slice(0, semicolon)).trim().toLowerCase();
}

/**
 * A request's fingerprint: by default a SHA-256 of its method, its URL (path and query), its
 * media type and the bytes of its body, so that the same key sent with another payload, another
 * Content-Type, or to another resource of the route, is told apart. With the route's own
 * function, the hash of what it returns.
 */
export function requestFingerprint(mode: RequestMode, request: KeyedRequest): string | null {
  if (mode.fingerprint === false) return null;
  if (typeof mode.fingerprint === 'function') {
    const value = mode.fingerprint(request);
    if (value === undefined || value === null) return null;
    return sha256Hex(
      value instanceof Uint8Array ? value : typeof value === 'string' ? value : JSON.stringify(value),
    );
  }
  const url = request.originalUrl ?? request.url ?? '';
  const bytes = bodyBytes(request);
  // A body that cannot be serialised (without rawBody) has no fingerprint: nothing to compare.
  if (bytes === undefined) return null;
  const type = mediaType(request.headers['content-type']);
  // JSON, and a request without a Content-Type (no body: `null`), hash as earlier releases did,
  // without the type, so that the claims they stored still match their retries. Every other type
  // is hashed with its bytes, and cannot meet those: neither a JSON text nor `null` starts with
  // `type/subtype\n`, and no media type holds a newline.
  if (type === 'application/json' || type === '') {
    return sha256Hex(request.method ?? '', '\n', url, '\n', bytes);
  }
  return sha256Hex(request.method ?? '', '\n', url, '\n', type, '\n', bytes);
}

/**
 * The bytes of a request's body: the raw body when the app keeps it (`rawBody: true`), a text or
 * Buffer body as its parser left it, else the parsed body serialised again (the same bytes for the
 * same JSON, spacing aside; `null` for none), else undefined when it cannot be serialised (nested
 * deeper than the stack, a cycle). A body no parser read was refused before (requestIdempotencyKey).
 */
function bodyBytes(request: KeyedRequest): string | Uint8Array | undefined {
  const { rawBody, body } = request;
  if (rawBody instanceof Uint8Array) return rawBody;
  if (typeof body === 'string' || body instanceof Uint8Array) return body;
  try {
    return JSON.stringify(body ?? null) ?? '';
  } catch {
    return undefined;
  }
}
