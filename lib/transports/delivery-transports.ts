import type { Provider, Type } from '@nestjs/common';
import { registryProviders } from '../core/registry.providers.js';
import type { DeliveryTransport } from './delivery-transport.js';
import { HttpTransport } from './http/http.transport.js';
import { RpcTransport } from './rpc/rpc.transport.js';

/**
 * The execution contexts `@IdempotentWebhook` protects, by `ExecutionContext.getType()`. A new
 * transport is a folder under transports/ and one entry here (and, for a context the explorer
 * refuses today, its rule in idempotency.explorer.ts).
 */
export const DELIVERY_TRANSPORTS = {
  http: HttpTransport,
  rpc: RpcTransport,
} satisfies Record<string, Type<DeliveryTransport>>;

/** DI token of the transport instances by context type. */
export const DELIVERY_TRANSPORT_REGISTRY = Symbol('DELIVERY_TRANSPORT_REGISTRY');

/** The transports and the registry the interceptor reads them from. */
export const deliveryTransportProviders: Provider[] = registryProviders<DeliveryTransport>(
  DELIVERY_TRANSPORT_REGISTRY,
  DELIVERY_TRANSPORTS,
);
