import { Injectable, UnauthorizedException, type CanActivate, type ExecutionContext } from '@nestjs/common';

/** The request as the guard leaves it: the caller's id, for the route and its idempotency keys. */
export interface AuthenticatedRequest {
  headers: Record<string, string | string[] | undefined>;
  userId?: string;
}

/** The longest user id: what the `refunds.user_id` column holds. */
export const MAX_USER_ID_LENGTH = 255;

/**
 * The sample's stand-in for real auth: `Authorization: Bearer <user id>`, any non-empty token of
 * at most 255 characters is a user. A request without one, or with a longer one (no user has such
 * an id: it is no credential, and a 401 says so where a 5xx would be retried forever), is refused
 * 401 here, before the idempotency claim.
 */
@Injectable()
export class BearerUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest<AuthenticatedRequest>();
    const header = request.headers.authorization;
    const token = typeof header === 'string' ? /^Bearer\s+(\S.*)$/i.exec(header)?.[1]?.trim() : undefined;
    if (!token) throw new UnauthorizedException('Authorization: Bearer <user id> is required');
    if (token.length > MAX_USER_ID_LENGTH) {
      throw new UnauthorizedException(
        `Authorization: Bearer <user id> takes a user id of at most ${MAX_USER_ID_LENGTH} characters, got ${token.length}`,
      );
    }
    request.userId = token;
    return true;
  }
}
