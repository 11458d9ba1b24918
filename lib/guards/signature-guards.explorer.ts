import { Inject, Injectable, type OnModuleInit } from '@nestjs/common';
import { GUARDS_METADATA, METHOD_METADATA, PATH_METADATA } from '@nestjs/common/constants.js';
import { DiscoveryService, HttpAdapterHost, MetadataScanner } from '@nestjs/core';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import type { IdempotencyConfig } from '../interfaces/index.js';
import { rawBodySetting, watchRawBody } from './raw-body-detector.js';
import { signatureGuardEntry, type SignatureGuardEntry } from './signature-guards.js';
import { secretsOf } from './signature-options.js';
import { loadStripeWebhooks } from './stripe-signature.guard.js';
import { describeError } from '../idempotency.messages.js';

export const signatureGuardsRefused = (problems: string[]) =>
  `IdempotencyModule refuses to start: these webhook routes could not verify their signatures:\n  - ${problems.join('\n  - ')}`;

export const signatureSecretMissing = (where: string, guard: string, option: string) =>
  `${where} is guarded by ${guard}, but IdempotencyModule option signatures.${option}.secret is not set`;

export const rawBodyNotEnabled = (where: string, guard: string) =>
  `${where} is guarded by ${guard}, which verifies the raw request body, but the app was created without rawBody: true: create it with NestFactory.create(AppModule, { rawBody: true }) (in tests, createNestApplication({ rawBody: true }))`;

const stripeNotInstalled = (where: string, error: unknown) =>
  `${where} is guarded by StripeSignatureGuard, which verifies with the stripe SDK, but it could not be loaded (${describeError(error)}): npm install stripe`;

export const signatureGuardOnMessageHandler = (where: string, guard: string) =>
  `${guard} on ${where}: a message handler; signature guards verify HTTP webhook deliveries (a broker message carries no sender signature headers)`;

/** Set by @EventPattern / @MessagePattern; a string, as @nestjs/microservices is optional. */
const MESSAGE_PATTERN = 'microservices:pattern';

/**
 * The boot check of the signature guards: every controller route guarded (on the method or its
 * class) by one of the shipped signature guards must be able to verify a delivery, or the app
 * does not start, naming Class.method and what to set: the sender's secret in `signatures`,
 * `rawBody: true` on the app, the stripe package for StripeSignatureGuard. A misconfiguration
 * therefore never shows as refused signatures in production. A signature guard on a message
 * handler fails the boot too (a broker message carries no signature). Guards registered
 * globally (APP_GUARD, useGlobalGuards) are not seen here; they check at the first request.
 */
@Injectable()
export class SignatureGuardsExplorer implements OnModuleInit {
  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly adapterHost: HttpAdapterHost,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
  ) {
    // Now, not in onModuleInit: Nest registers its body parsers before any onModuleInit runs.
    watchRawBody(adapterHost);
  }

  async onModuleInit(): Promise<void> {
    const problems: string[] = [];
    const rawBody = rawBodySetting(this.adapterHost.httpAdapter);
    for (const wrapper of this.discovery.getControllers()) {
      const type = wrapper.metatype as (new (...args: any[]) => unknown) | null | undefined;
      const prototype = type?.prototype as Record<string, unknown> | undefined;
      if (typeof type !== 'function' || !prototype) continue;
      const onClass = guardsOf(type);
      for (const name of this.scanner.getAllMethodNames(prototype)) {
        const method = prototype[name];
        if (typeof method !== 'function') continue;
        const route =
          Reflect.hasMetadata(PATH_METADATA, method) && Reflect.hasMetadata(METHOD_METADATA, method);
        const message = Reflect.hasMetadata(MESSAGE_PATTERN, method);
        if (!route && !message) continue; // not a handler: Nest runs no guard on it
        const where = `${type.name}.${name}`;
        for (const entry of new Set([...onClass, ...guardsOf(method)])) {
          const guard = entry.guard.name;
          if (!route) {
            problems.push(signatureGuardOnMessageHandler(where, guard));
            continue;
          }
          if (secretsOf(this.config.signatures?.[entry.option]).length === 0) {
            problems.push(signatureSecretMissing(where, guard, entry.option));
          }
          if (rawBody === 'disabled') problems.push(rawBodyNotEnabled(where, guard));
          if (entry.name === 'stripe') {
            const failure = await loadStripeWebhooks().then(
              () => undefined,
              (error: unknown) => error,
            );
            if (failure !== undefined) problems.push(stripeNotInstalled(where, failure));
          }
        }
      }
    }
    if (problems.length > 0) throw new Error(signatureGuardsRefused(problems));
  }
}

/** The shipped signature guards among the `@UseGuards` of a class or method. */
function guardsOf(target: object): SignatureGuardEntry[] {
  const guards = (Reflect.getMetadata(GUARDS_METADATA, target) ?? []) as unknown[];
  return guards.map(signatureGuardEntry).filter((entry) => entry !== undefined);
}
