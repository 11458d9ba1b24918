import { Injectable, type CallHandler, type NestInterceptor } from '@nestjs/common';
import type { Observable } from 'rxjs';

/**
 * An interceptor that does nothing. Behind it, raw-tx measures the pipeline Nest builds around
 * every route with an interceptor, which `@IdempotentWebhook` has by design.
 */
@Injectable()
export class PassThroughInterceptor implements NestInterceptor {
  intercept(_context: unknown, next: CallHandler): Observable<unknown> {
    return next.handle();
  }
}
