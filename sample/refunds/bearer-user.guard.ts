import { Injectable, UnauthorizedException, type CanActivate, type ExecutionContext } from '@nestjs/common';

/** The request as the guard leaves it: the caller's id, for the route and its idempotency keys. */
export interface AuthenticatedRequest {
  headers: Record<string, string | string[] | undefined>;
  userId?: string;
}

/**
 * The sample's stand-in for real auth: `Authorization: Bearer <user id>`, any non-empty token is
 * a user. A request without one is refused 401 here, before the idempotency claim.
 */
@Injectable()
export class BearerUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const request = context.switchToHttp().getRequest<AuthenticatedRequest>();
    const header = request.headers.authorization;
    const token = typeof header === 'string' ? /^Bearer\s+(\S.*)$/i.exec(header)?.[1]?.trim() : undefined;
    if (!token) throw new UnauthorizedException('Authorization: Bearer <user id> is required');
    request.userId = token;
    return true;
  }
}
