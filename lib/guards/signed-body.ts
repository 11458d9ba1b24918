import type { SignedRequest } from './raw-body.js';
import { WebhookSignatureError } from './webhook-signature.error.js';

/**
 * A kind of body a sender signs: `json` is `application/json` (or `application/<x>+json`), `form`
 * is `application/x-www-form-urlencoded`, which only GitHub's webhook settings offer.
 */
export type SignedBodyType = 'json' | 'form';

/** The media types each kind of body is sent as (parameters such as charset aside). */
const MEDIA_TYPES: Record<SignedBodyType, { test(mediaType: string): boolean; name: string }> = {
  json: { test: (type) => /^application\/(?:[^/]+\+)?json$/.test(type), name: 'application/json' },
  form: {
    test: (type) => type === 'application/x-www-form-urlencoded',
    name: 'application/x-www-form-urlencoded',
  },
};

/** The answer to a correctly signed delivery whose body is empty. */
export const signedBodyEmpty = (header: string) =>
  `${header} is valid, but the signed body is empty; a delivery carries its event as JSON`;

/** The answer to a correctly signed delivery whose bytes the sender's SDK cannot parse as JSON. */
export const signedBodyNotJson = (header: string, reason: string) =>
  `${header} is valid, but the signed body is not JSON (${reason}); a delivery carries its event as UTF-8 JSON`;

/** The answer to a correctly signed delivery that the platform parsed as something other than JSON. */
export const signedBodyWrongType = (header: string, contentType: string, expected: string) =>
  `${header} is valid, but the body is ${contentType}, not ${expected}; the handler would get the fields of a ${contentType} body, not the sender's event`;

/**
 * Refuses, as a `body` failure naming `header`, a verified delivery whose body the handler would
 * not get as the sender's event: an empty one (Express parses it to `{}`), or one the platform
 * parsed under another content type than the sender's (a form's fields instead of the JSON
 * object). A JSON content type means the platform's JSON parser read these very bytes (it
 * answers 400 itself when they are not JSON), so nothing is parsed twice here. Run after the
 * signature is verified: a forged body gets its 401, never a hint about what would pass.
 */
export function requireSignedBody(
  request: SignedRequest,
  rawBody: Buffer,
  header: string,
  types: readonly SignedBodyType[],
): void {
  if (rawBody.length === 0) throw new WebhookSignatureError('body', header, signedBodyEmpty(header));
  const declared = request.headers['content-type'];
  const contentType = Array.isArray(declared) ? declared.join(', ') : (declared ?? 'none');
  const mediaType = contentType.split(';')[0].trim().toLowerCase();
  if (types.some((type) => MEDIA_TYPES[type].test(mediaType))) return;
  const expected = types.map((type) => MEDIA_TYPES[type].name).join(' or ');
  throw new WebhookSignatureError('body', header, signedBodyWrongType(header, contentType, expected));
}
