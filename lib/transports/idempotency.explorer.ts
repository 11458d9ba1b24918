import { Injectable, StreamableFile, type OnModuleInit } from '@nestjs/common';
import { Readable } from 'node:stream';
import { Observable } from 'rxjs';
import { DiscoveryService, MetadataScanner } from '@nestjs/core';
import type { InstanceWrapper } from '@nestjs/core/injector/instance-wrapper.js';
import { IDEMPOTENT_METHOD_METADATA, IDEMPOTENT_WEBHOOK_METADATA } from '../idempotency.constants.js';
import { unprotectedHandlers } from '../idempotency.messages.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { webhookTransactionManager } from './webhook-transaction.decorator.js';

export const methodOnFactoryProvider = (where: string, token: string) =>
  `@Idempotent on ${where}: the provider ${token} is built by useValue or useFactory, so Nest cannot inject the IdempotencyService its calls need; provide the class itself (useClass or the class as provider)`;

export const gatewayUnsupported = (decorator: string, where: string) =>
  `${decorator} on ${where}: WebSocket gateways are not supported (a socket message has no redelivery to answer); call IdempotencyService.run() from the handler`;

export const resolverUnsupported = (decorator: string, where: string) =>
  `${decorator} on ${where}: GraphQL resolvers are not supported; call IdempotencyService.run() from the resolver`;

export const webhookOffHandler = (where: string) =>
  `@IdempotentWebhook on ${where}: not a controller route or message handler, so no interceptor would run it; use @Idempotent on provider methods`;

export const methodOnHandler = (where: string) =>
  `@Idempotent on ${where}: a route or message handler; use @IdempotentWebhook, which answers duplicates in flight with 409/503 + Retry-After`;

/**
 * Metadata keys other packages set, read here to tell where a decorated method lives. Strings, not
 * imports: @nestjs/microservices, @nestjs/websockets and @nestjs/graphql are optional.
 */
const ROUTE_PATH = 'path'; // @nestjs/common PATH_METADATA, set by @Get, @Post, ...
const ROUTE_METHOD = 'method'; // @nestjs/common METHOD_METADATA
const MESSAGE_PATTERN = 'microservices:pattern'; // @EventPattern, @MessagePattern
const GATEWAY = 'websockets:is_gateway'; // @WebSocketGateway, on the class
const GATEWAY_MESSAGE = 'websockets:message_mapping'; // @SubscribeMessage
const GRAPHQL_RESOLVER = 'graphql:resolver_type'; // @Resolver on the class; @Query, @Mutation, ...
const GRAPHQL_RESOLVER_NAME = 'graphql:resolver_name';
const ROUTE_ARGUMENTS = '__routeArguments__'; // @nestjs/common ROUTE_ARGS_METADATA, on the class
const RESPONSE_PASSTHROUGH = '__responsePassthrough__'; // @Res({ passthrough: true })
const SSE = '__sse__'; // @nestjs/common SSE_METADATA, set by @Sse()
/** RouteParamtypes.RESPONSE (`@Res()`) and NEXT (`@Next()`): route argument keys `1:<index>`, `2:<index>`. */
const RESPONSE_ARGUMENT = /^[12]:\d+$/;

/** A handler with `@Res()` or `@Next()` (without passthrough): it sends its own answer. */
const responseOwnedByHandler = (where: string) =>
  `${where} takes @Res() or @Next() and sends its own answer: that answer would leave before the ` +
  `claim's COMMIT (a failed COMMIT would lose the event after its 200), a retried transaction ` +
  `would send it twice, and a replay (the handler not called) would send none. Return the answer ` +
  `instead, or use @Res({ passthrough: true }) to set headers and status.`;

/** A request-mode route that streams: there is no one body to store and replay. */
const requestStreams = (where: string, what: string) =>
  `@IdempotentRequest on ${where}: it ${what}, and a request-mode route stores its response for ` +
  `its retries, which a stream cannot be. Return a JSON body (a Location to stream the rest from).`;

/** Request mode on a message handler. */
const requestOffHttp = (where: string) =>
  `@IdempotentRequest on ${where}: a message handler; the Idempotency-Key header is HTTP's. Use ` +
  `@IdempotentWebhook, which stores a @MessagePattern's reply for its replays.`;

/** `@WebhookTransaction()` on an external-mode handler. */
const transactionInExternalMode = (where: string) =>
  `${where} runs in external mode and takes @WebhookTransaction(): external mode holds no claim ` +
  `transaction, so there is no manager whose writes commit with the claim. Inject your repository ` +
  `or DataSource for those writes (keep them idempotent on their own), or use transaction mode.`;

/**
 * nestjs/schedule's explorer, for refusals: at start-up, every controller and provider method
 * carrying `@IdempotentWebhook` or `@Idempotent` is checked against where it can be honoured, and
 * the boot fails naming each class and method that would otherwise run unprotected (or answer a
 * duplicate the wrong way). No silent no-op anywhere.
 */
@Injectable()
export class IdempotencyExplorer implements OnModuleInit {
  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly database: ClaimDatabase,
  ) {}

  async onModuleInit(): Promise<void> {
    const problems: string[] = [];
    const storing: string[] = [];
    for (const wrapper of this.discovery.getControllers()) this.check(wrapper, true, problems, storing);
    for (const wrapper of this.discovery.getProviders()) this.check(wrapper, false, problems, storing);
    if (problems.length > 0) throw new Error(unprotectedHandlers(problems));
    // Request-mode routes need the table's stored-response columns (a boot failure naming the
    // migration); other handlers go without their key checks (ClaimDatabase warns).
    await this.database.requireStoredColumns(storing);
  }

  private check(wrapper: InstanceWrapper, controller: boolean, problems: string[], storing: string[]): void {
    const type = classOf(wrapper);
    const prototype = type?.prototype as Record<string, unknown> | undefined;
    if (!type || !prototype) return;
    const gateway = Reflect.getMetadata(GATEWAY, type) === true;
    const resolver =
      Reflect.hasMetadata(GRAPHQL_RESOLVER, type) || Reflect.hasMetadata(GRAPHQL_RESOLVER_NAME, type);
    for (const name of this.scanner.getAllMethodNames(prototype)) {
      const method = prototype[name];
      if (typeof method !== 'function') continue;
      const webhook = Reflect.hasMetadata(IDEMPOTENT_WEBHOOK_METADATA, method);
      const plain = Reflect.hasMetadata(IDEMPOTENT_METHOD_METADATA, method);
      if (!webhook && !plain) continue;
      const where = `${type.name}.${name}`;
      const request = webhook
        ? (Reflect.getMetadata(IDEMPOTENT_WEBHOOK_METADATA, method) as { request?: object }).request !==
          undefined
        : false;
      const decorator = request ? '@IdempotentRequest' : webhook ? '@IdempotentWebhook' : '@Idempotent';
      if (gateway || Reflect.hasMetadata(GATEWAY_MESSAGE, method)) {
        problems.push(gatewayUnsupported(decorator, where));
      } else if (resolver || Reflect.hasMetadata(GRAPHQL_RESOLVER, method)) {
        problems.push(resolverUnsupported(decorator, where));
      } else {
        const handler =
          controller &&
          ((Reflect.hasMetadata(ROUTE_PATH, method) && Reflect.hasMetadata(ROUTE_METHOD, method)) ||
            Reflect.hasMetadata(MESSAGE_PATTERN, method));
        if (webhook && !handler) {
          problems.push(webhookOffHandler(where));
        } else if (webhook) {
          problems.push(...handlerArgumentProblems(type, name, method, where));
          if (request) {
            storing.push(where);
            problems.push(...requestModeProblems(type, name, method, where));
          }
        } else if (plain && handler) {
          problems.push(methodOnHandler(where));
        } else if (plain && !controller && (!wrapper.metatype || wrapper.inject)) {
          // Property injection only reaches instances Nest constructs from the class.
          problems.push(methodOnFactoryProvider(where, String(wrapper.name)));
        }
      }
    }
  }
}

/**
 * What a protected handler's parameters get wrong: `@Res()` or `@Next()` without passthrough (the
 * handler answers, not the library), `@WebhookTransaction()` in external mode. Read from the route
 * arguments Nest's parameter decorators record on the class.
 */
function handlerArgumentProblems(type: object, name: string, method: object, where: string): string[] {
  const args = (Reflect.getMetadata(ROUTE_ARGUMENTS, type, name) ?? {}) as Record<
    string,
    { factory?: unknown }
  >;
  const problems: string[] = [];
  const ownsResponse = Object.keys(args).some((argument) => RESPONSE_ARGUMENT.test(argument));
  if (ownsResponse && Reflect.getMetadata(RESPONSE_PASSTHROUGH, type, name) !== true) {
    problems.push(responseOwnedByHandler(where));
  }
  const meta = Reflect.getMetadata(IDEMPOTENT_WEBHOOK_METADATA, method) as { mode?: string } | undefined;
  const wantsTransaction = Object.values(args).some((arg) => arg?.factory === webhookTransactionManager);
  if (meta?.mode === 'external' && wantsTransaction) problems.push(transactionInExternalMode(where));
  return problems;
}

/**
 * What a request-mode route gets wrong: it is a message handler, or it streams (`@Sse()`, or a
 * declared return type of StreamableFile, a stream or an Observable, read from the
 * `design:returntype` TypeScript emits; an async method's is Promise, and what it resolves to is
 * refused when it is returned).
 */
function requestModeProblems(type: object, name: string, method: object, where: string): string[] {
  if (Reflect.hasMetadata(MESSAGE_PATTERN, method)) return [requestOffHttp(where)];
  if (Reflect.getMetadata(SSE, method)) return [requestStreams(where, 'is an @Sse() route')];
  // TypeScript records it on the prototype, where the method is.
  const prototype = (type as { prototype: object }).prototype;
  const returned = Reflect.getMetadata('design:returntype', prototype, name) as unknown;
  const streams =
    typeof returned === 'function' &&
    (returned === StreamableFile ||
      returned === Observable ||
      returned === Readable ||
      returned.prototype instanceof Readable ||
      returned.prototype instanceof StreamableFile);
  return streams ? [requestStreams(where, `returns ${(returned as { name: string }).name}`)] : [];
}

/** The class behind a wrapper; useValue and useFactory providers have only their instance's. */
function classOf(wrapper: InstanceWrapper): (new (...args: any[]) => unknown) | undefined {
  const metatype = !wrapper.metatype || wrapper.inject ? wrapper.instance?.constructor : wrapper.metatype;
  return typeof metatype === 'function' ? (metatype as new (...args: any[]) => unknown) : undefined;
}
