import { rawBodySetting } from './raw-body-detector.js';
import { WebhookSignatureError } from './webhook-signature.error.js';

export const rawBodyNotKept = (header: string, contentType: string | undefined) =>
  `Cannot verify ${header}: the request has no raw body to check (Content-Type ${contentType ?? 'none'}); Nest keeps the raw bytes of application/json and application/x-www-form-urlencoded bodies only`;

export const rawBodyDisabled = (header: string) =>
  `Cannot verify ${header}: request.rawBody is not set. Create the app with rawBody: true (NestFactory.create(AppModule, { rawBody: true })); with bodyParser: false, set request.rawBody to the body's bytes in your own parser`;

/** The request fields a guard reads; the same on Express's request and Fastify's. */
export interface SignedRequest {
  headers: Record<string, string | string[] | undefined>;
  rawBody?: Buffer;
  body?: unknown;
}

/**
 * The exact bytes the sender signed: `request.rawBody`, which Nest sets (Express and Fastify
 * alike) when the app is created with `rawBody: true`. Never the parsed body: re-serialised JSON
 * differs from the signed bytes in spacing, key order and escapes.
 *
 * When it is missing, whose fault it is decides the answer. The app kept raw bodies but not this
 * one: the request's content type is one Nest's parsers do not keep (a sender always sends JSON
 * or a form), so the request is wrong: 400. Otherwise the app never keeps them (`bodyParser:
 * false` without a parser of its own, or a guard the boot check could not see): a server fault,
 * 500 saying how to fix it, never a 401 that would blame the sender's signature.
 */
export function readRawBody(request: SignedRequest, header: string, adapter: object | undefined): Buffer {
  const raw = request.rawBody;
  if (Buffer.isBuffer(raw)) return raw;
  if (rawBodySetting(adapter) === 'enabled') {
    const contentType = request.headers['content-type'];
    throw new WebhookSignatureError(
      'unverifiable',
      header,
      rawBodyNotKept(header, Array.isArray(contentType) ? contentType.join(', ') : contentType),
    );
  }
  throw new WebhookSignatureError('no_raw_body', header, rawBodyDisabled(header));
}
