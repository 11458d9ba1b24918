import { randomBytes, timingSafeEqual } from 'node:crypto';

/** The cookie that holds the console's CSRF token (double-submit: the form repeats it). */
export const CSRF_COOKIE = 'idempotency_console_csrf';
/** The form field that repeats it. */
export const CSRF_FIELD = '_csrf';

/** 32 random bytes, base64url: what a token looks like. */
const TOKEN = /^[A-Za-z0-9_-]{43}$/;

/** The request headers the checks read, lower-cased as Node has them. */
export type RequestHeaders = Record<string, string | string[] | undefined>;

/** The value of cookie `name` in a Cookie header, or undefined. */
export function readCookie(headers: RequestHeaders, name: string): string | undefined {
  const header = headers.cookie;
  const cookies = Array.isArray(header) ? header.join('; ') : (header ?? '');
  for (const pair of cookies.split(';')) {
    const at = pair.indexOf('=');
    if (at > 0 && pair.slice(0, at).trim() === name) return pair.slice(at + 1).trim();
  }
  return undefined;
}

/**
 * The console's token for this browser: the one its cookie holds, or a new one with the
 * Set-Cookie header that stores it (HttpOnly, SameSite=Strict, only for the console's path).
 */
export function csrfToken(
  headers: RequestHeaders,
  path: string,
  secure: boolean,
): { token: string; setCookie?: string } {
  const current = readCookie(headers, CSRF_COOKIE);
  if (current && TOKEN.test(current)) return { token: current };
  const token = randomBytes(32).toString('base64url');
  const attributes = [`Path=${path}`, 'HttpOnly', 'SameSite=Strict', ...(secure ? ['Secure'] : [])];
  return { token, setCookie: `${CSRF_COOKIE}=${token}; ${attributes.join('; ')}` };
}

/**
 * Why a form post is refused, or undefined when it may act. Two checks, each enough on its own
 * in a current browser: the token in the form must equal the one in the cookie (a page of another
 * site can neither read the cookie nor, with SameSite=Strict, send it), and the request must not
 * come from another site (Sec-Fetch-Site, or an Origin naming another host).
 */
export function csrfRefusal(headers: RequestHeaders, submitted: unknown): string | undefined {
  const site = headers['sec-fetch-site'];
  if (typeof site === 'string' && site !== 'same-origin' && site !== 'none') {
    return `the form was sent from another site (Sec-Fetch-Site: ${site})`;
  }
  const origin = headers.origin;
  if (typeof origin === 'string' && origin !== 'null') {
    let host: string | undefined;
    try {
      host = new URL(origin).host;
    } catch {
      return `the form's Origin is not a URL (${origin})`;
    }
    const forwarded = headers['x-forwarded-host'];
    const hosts = [headers.host, ...(typeof forwarded === 'string' ? forwarded.split(',') : [])].map((h) =>
      typeof h === 'string' ? h.trim() : h,
    );
    if (!hosts.includes(host)) return `the form was sent from ${origin}, not from this console`;
  }
  const cookie = readCookie(headers, CSRF_COOKIE);
  if (!cookie || !TOKEN.test(cookie)) return 'the browser sent no console token (its cookie is missing)';
  if (typeof submitted !== 'string' || !TOKEN.test(submitted)) return 'the form carries no console token';
  if (!timingSafeEqual(Buffer.from(cookie), Buffer.from(submitted))) {
    return "the form's console token is not this browser's";
  }
  return undefined;
}
