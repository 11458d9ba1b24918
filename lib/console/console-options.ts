import type { CanActivate, ModuleMetadata, Type } from '@nestjs/common';
import { ConsoleTokenGuard } from './console-token.guard.js';

/** Options of `IdempotencyConsoleModule.forRoot()`: `token`, `guard`, or both. */
export interface IdempotencyConsoleOptions {
  /**
   * The operators' secret: every page and action needs `Authorization: Bearer <token>`, or a
   * browser's sign-in with the token as its password (any user name), compared in constant time;
   * anything else is answered 401. At least 32 characters of a bearer token's alphabet (letters,
   * digits, `-._~+/`, `=` at the end: `openssl rand -base64 32` makes one). Given but unset
   * (`process.env.CONSOLE_TOKEN` of an environment without it), empty or short, it fails the boot
   * rather than open the console to anyone. With `guard` too, a request must pass both.
   * @default none (give token, guard, or both)
   */
  token?: string;
  /**
   * A guard of your own that every page and action passes (after the token, if there is one):
   * your authentication and authorisation (an SSO session with an operators-only role). A class
   * is instantiated by Nest in the console's module (its dependencies come from `imports` or
   * global modules); an instance is used as it is.
   * @default none (give token, guard, or both)
   */
  guard?: Type<CanActivate> | CanActivate;
  /**
   * Where the console is served, below the app's global prefix if it has one.
   * @default 'idempotency'
   */
  path?: string;
  /**
   * Modules the guard's dependencies come from, when it is a class that needs some.
   * @default []
   */
  imports?: ModuleMetadata['imports'];
  /**
   * Claims listed per state (in flight, expired, failed, poison), and dead-lettered jobs.
   * @default 50
   */
  limit?: number;
  /**
   * The page's title, to tell consoles of several apps apart.
   * @default 'Idempotency console'
   */
  title?: string;
}

/** The options with their defaults, checked. */
export interface ConsoleConfig {
  /** The token's check first, if there is a token, then the app's own guard. */
  guards: (Type<CanActivate> | CanActivate)[];
  path: string;
  limit: number;
  title: string;
}

const KNOWN = ['token', 'guard', 'path', 'imports', 'limit', 'title'];

/** Shorter is guessable; `openssl rand -base64 32` makes 44 characters. */
const MIN_TOKEN_LENGTH = 32;
/** RFC 6750's b64token: what an Authorization header carries as a bearer token. */
const TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/;

/** A path of URL-safe segments (letters, digits, `-`, `_`, `.`; never `.` or `..`), separated by `/`. */
const PATH = /^(?!\.{1,2}(\/|$))[A-Za-z0-9._-]+(\/(?!\.{1,2}(\/|$))[A-Za-z0-9._-]+)*$/;

const refuse = (message: string) => new Error(`IdempotencyConsoleModule refuses to start: ${message}`);

/** A guard class (a function with canActivate on its prototype) or an instance with canActivate. */
function isGuard(guard: unknown): guard is Type<CanActivate> | CanActivate {
  if (typeof guard === 'function')
    return typeof (guard.prototype as CanActivate | undefined)?.canActivate === 'function';
  return typeof (guard as CanActivate | null)?.canActivate === 'function';
}

/**
 * Refuses a token that would leave the console open or guessable. Given but undefined is the
 * likeliest mistake of all (an environment variable not set where the app runs), and the one a
 * hand-written comparison turns into `Bearer undefined` letting anyone in.
 */
function checkToken(token: unknown): asserts token is string {
  if (token === undefined || token === null) {
    throw refuse(
      `token is ${String(token)}: the variable it is read from is not set where the app runs. Set it to a ` +
        `random secret of ${MIN_TOKEN_LENGTH} characters or more (openssl rand -base64 32)`,
    );
  }
  if (typeof token !== 'string') throw refuse(`token must be a string, got ${typeof token}`);
  if (token.length === 0) throw refuse('token is empty: set it to a random secret (openssl rand -base64 32)');
  if (!TOKEN.test(token)) {
    throw refuse(
      'token holds characters an Authorization header cannot carry as a bearer token (a space, a ' +
        "line break from the file it was read from?): use letters, digits and -._~+/, with '=' only at the end",
    );
  }
  if (token.length < MIN_TOKEN_LENGTH) {
    throw refuse(
      `token has ${token.length} characters, fewer than ${MIN_TOKEN_LENGTH}: use a random secret ` +
        '(openssl rand -base64 32)',
    );
  }
}

/** Checks the options (a mistake fails the boot) and fills in the defaults. */
export function resolveConsoleOptions(options: IdempotencyConsoleOptions | undefined): ConsoleConfig {
  for (const name of Object.keys(options ?? {})) {
    if (!KNOWN.includes(name)) throw refuse(`option ${name} is unknown (known: ${KNOWN.join(', ')})`);
  }
  const {
    guard,
    token,
    path = 'idempotency',
    limit = 50,
    title = 'Idempotency console',
  } = options ?? ({} as never);
  const hasToken = Object.hasOwn(options ?? {}, 'token');
  if (!hasToken && (guard === undefined || guard === null)) {
    throw refuse(
      'it needs a token (forRoot({ token: process.env.CONSOLE_TOKEN })) or a guard of your own ' +
        '(forRoot({ guard: OperatorsGuard })): the console releases leases and forgets claims, and must ' +
        'never be open to whoever reaches the app',
    );
  }
  if (hasToken) checkToken(token);
  if (guard !== undefined && guard !== null && !isGuard(guard)) {
    throw refuse('guard must be a CanActivate class or instance (something with a canActivate() method)');
  }
  const trimmed = typeof path === 'string' ? path.replace(/^\/+|\/+$/g, '') : path;
  if (typeof trimmed !== 'string' || !PATH.test(trimmed)) {
    throw refuse(`path must be URL path segments of letters, digits, -, _ and ., got ${String(path)}`);
  }
  if (!Number.isInteger(limit) || limit < 1 || limit > 1_000) {
    throw refuse(`limit must be a whole number from 1 to 1000, got ${String(limit)}`);
  }
  if (typeof title !== 'string' || title.length === 0) throw refuse('title must be a non-empty string');
  const guards: ConsoleConfig['guards'] = hasToken ? [new ConsoleTokenGuard(token!)] : [];
  if (guard !== undefined && guard !== null) guards.push(guard);
  return { guards, path: trimmed, limit, title };
}
