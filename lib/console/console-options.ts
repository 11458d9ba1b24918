import type { CanActivate, ModuleMetadata, Type } from '@nestjs/common';

/** Options of `IdempotencyConsoleModule.forRoot()`. */
export interface IdempotencyConsoleOptions {
  /**
   * The guard every page and action of the console passes first: your authentication and
   * authorisation (an operators-only role, a VPN-only header). Required: the console lets its
   * user release leases and forget claims, so it refuses to boot without one. A class is
   * instantiated by Nest in the console's module (its dependencies come from `imports` or global
   * modules); an instance is used as it is.
   * @default none (required)
   */
  guard: Type<CanActivate> | CanActivate;
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
  guard: Type<CanActivate> | CanActivate;
  path: string;
  limit: number;
  title: string;
}

const KNOWN = ['guard', 'path', 'imports', 'limit', 'title'];

/** A path of URL-safe segments (letters, digits, `-`, `_`, `.`; never `.` or `..`), separated by `/`. */
const PATH = /^(?!\.{1,2}(\/|$))[A-Za-z0-9._-]+(\/(?!\.{1,2}(\/|$))[A-Za-z0-9._-]+)*$/;

const refuse = (message: string) => new Error(`IdempotencyConsoleModule refuses to start: ${message}`);

/** A guard class (a function with canActivate on its prototype) or an instance with canActivate. */
function isGuard(guard: unknown): guard is Type<CanActivate> | CanActivate {
  if (typeof guard === 'function')
    return typeof (guard.prototype as CanActivate | undefined)?.canActivate === 'function';
  return typeof (guard as CanActivate | null)?.canActivate === 'function';
}

/** Checks the options (a mistake fails the boot) and fills in the defaults. */
export function resolveConsoleOptions(options: IdempotencyConsoleOptions | undefined): ConsoleConfig {
  for (const name of Object.keys(options ?? {})) {
    if (!KNOWN.includes(name)) throw refuse(`option ${name} is unknown (known: ${KNOWN.join(', ')})`);
  }
  const { guard, path = 'idempotency', limit = 50, title = 'Idempotency console' } = options ?? ({} as never);
  if (guard === undefined || guard === null) {
    throw refuse(
      'it needs a guard (forRoot({ guard: YourOperatorsGuard })): the console releases leases and forgets ' +
        'claims, and must never be open to whoever reaches the app',
    );
  }
  if (!isGuard(guard)) {
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
  return { guard, path: trimmed, limit, title };
}
