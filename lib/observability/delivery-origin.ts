import type { ExecutionContext } from '@nestjs/common';

/**
 * Where a delivery came from, for its span: the messaging system and destination (OpenTelemetry's
 * `messaging.system` and `messaging.destination.name`), and for a handed-off job the trace
 * context it carries. Transports pass it to the claim runner; a caller that passes none (a
 * provider method, `IdempotencyService.run()`) is named after its scope.
 */
export interface QueueOrigin {
  system: string;
  destination: string;
  /** The job's TraceCarrier, continued as the span's parent. */
  carrier?: unknown;
}

/**
 * An interceptor's ExecutionContext (read only when a span is made, so a delivery without
 * tracing computes nothing) or a queue's origin.
 */
export type DeliveryOrigin = ExecutionContext | QueueOrigin;

/** `messaging.system` and `messaging.destination.name` of one delivery. */
export interface OriginAttributes {
  system: string;
  destination: string;
}

/** Nest's microservice context classes → the messaging system names OpenTelemetry uses. */
const RPC_SYSTEMS: Readonly<Record<string, string>> = {
  TcpContext: 'tcp',
  RedisContext: 'redis',
  NatsContext: 'nats',
  MqttContext: 'mqtt',
  KafkaContext: 'kafka',
  RmqContext: 'rabbitmq',
};

/** The accessor each microservice context has for the channel, subject, topic or pattern. */
const RPC_DESTINATIONS = ['getPattern', 'getChannel', 'getSubject', 'getTopic'] as const;

/** The attributes of `origin`; `scope` names what has no destination of its own. */
export function originAttributes(origin: DeliveryOrigin | undefined, scope: string): OriginAttributes {
  if (origin === undefined) return { system: 'method', destination: scope };
  if (!isExecutionContext(origin)) return { system: origin.system, destination: origin.destination };
  if (origin.getType() === 'http') {
    // Express keeps the matched route on request.route, Fastify on request.routeOptions.
    const request = origin.switchToHttp().getRequest<{
      route?: { path?: unknown };
      routeOptions?: { url?: unknown };
      url?: string;
    }>();
    const route = request.route?.path ?? request.routeOptions?.url;
    return { system: 'webhook', destination: typeof route === 'string' ? route : scope };
  }
  if (origin.getType() === 'rpc') {
    const rpc = origin.switchToRpc().getContext<Record<string, unknown> | undefined>();
    const name = (rpc?.constructor as { name?: string } | undefined)?.name ?? '';
    const system = RPC_SYSTEMS[name] ?? (name.replace(/Context$/, '').toLowerCase() || 'rpc');
    for (const accessor of RPC_DESTINATIONS) {
      const read = rpc?.[accessor];
      if (typeof read === 'function') {
        const destination: unknown = read.call(rpc);
        if (typeof destination === 'string' && destination) return { system, destination };
      }
    }
    return { system, destination: scope };
  }
  return { system: origin.getType(), destination: scope };
}

function isExecutionContext(origin: DeliveryOrigin): origin is ExecutionContext {
  return typeof (origin as ExecutionContext).getType === 'function';
}
