import { createHash, timingSafeEqual } from 'node:crypto';
import { UnauthorizedException, type CanActivate, type ExecutionContext } from '@nestjs/common';

/**
 * The challenge of a refused request. Basic first: a browser answers it with its own sign-in
 * prompt (the token as the password), so the console opens in a browser with nothing else set up;
 * Bearer for scripts and proxies that send the token themselves (RFC 6750).
 */
const CHALLENGE = 'Basic realm="idempotency console", charset="UTF-8", Bearer realm="idempotency console"';

const consoleTokenRefused = () =>
  'The idempotency console needs its token: send Authorization: Bearer <token>, or sign in with the ' +
  'token as the password';

/** The request and reply surface used here, common to Express and Fastify. */
interface TokenRequest {
  headers: Record<string, string | string[] | undefined>;
}
interface TokenReply {
  header(name: string, value: string): unknown;
}

/** A fixed-length digest, so that comparing two of them takes the same time whatever they hold. */
const digest = (text: string) => createHash('sha256').update(text, 'utf8').digest();

/**
 * The token an `Authorization` header presents: `Bearer <token>`, or `Basic` credentials whose
 * password is the token (any user name: a browser's prompt asks for one). The scheme is
 * case-insensitive (RFC 9110). Anything else presents none.
 */
function presentedToken(header: unknown): string | undefined {
  if (typeof header !== 'string') return undefined;
  const match = /^(Bearer|Basic)[ ]+(\S+)[ ]*$/i.exec(header);
  if (!match) return undefined;
  const [, scheme, credentials] = match;
  if (scheme!.toLowerCase() === 'bearer') return credentials;
  const decoded = Buffer.from(credentials!, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon === -1 ? undefined : decoded.slice(colon + 1);
}

/**
 * The console's own check of its `token` option: a request passes when its `Authorization`
 * header presents the token, compared in constant time (both sides hashed to SHA-256 first, so
 * neither the length nor the bytes of the token leak through how long a refusal takes). Others
 * are answered 401 with a challenge, before any route runs.
 */
export class ConsoleTokenGuard implements CanActivate {
  private readonly expected: Buffer;

  constructor(token: string) {
    this.expected = digest(token);
  }

  canActivate(context: ExecutionContext): boolean {
    const http = context.switchToHttp();
    const presented = presentedToken(http.getRequest<TokenRequest>().headers.authorization);
    if (presented !== undefined && timingSafeEqual(digest(presented), this.expected)) return true;
    http.getResponse<TokenReply>().header('WWW-Authenticate', CHALLENGE);
    throw new UnauthorizedException(consoleTokenRefused());
  }
}
