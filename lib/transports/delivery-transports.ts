import type { Provider } from '@nestjs/common';
import { HttpTransport } from './http/http.transport.js';
import { RpcTransport } from './rpc/rpc.transport.js';

/**
 * The transports of the execution contexts `@IdempotentWebhook` protects: `http` and `rpc`, as
 * `ExecutionContext.getType()` names them; the interceptor chooses by that type
 * (IdempotencyInterceptor.transportFor). A new transport is a folder under transports/, a provider
 * here and a branch there (and, for a context the explorer refuses today, its rule in
 * idempotency.explorer.ts).
 */
export const deliveryTransportProviders: Provider[] = [HttpTransport, RpcTransport];
