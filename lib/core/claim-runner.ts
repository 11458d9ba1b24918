import { Inject, Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService } from '@nestjs/core';
import { IDEMPOTENCY_CONFIG } from '../idempotency.constants.js';
import { PropagationError } from '../idempotency.errors.js';
import type { IdempotencyConfig, IdempotentRunResult } from '../interfaces/index.js';
import {
  createClsTransactionBridge,
  type ClsTransactionBridge,
} from '../integrations/cls-transactional.bridge.js';
import type { DeliveryOrigin } from '../observability/delivery-origin.js';
import { DeliveryTelemetry } from '../observability/delivery-telemetry.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { LeaseStrategy } from '../strategies/lease.strategy.js';
import { TransactionStrategy } from '../strategies/transaction.strategy.js';
import { ClaimDelivery, type IdempotentDelivery } from './claim-delivery.js';
import type { ClaimCheck } from './claim-check.js';
import { claimRefusal } from './claim-refusal.js';
import type { ClaimResult } from './claim-result.js';
import type { ClaimHandle, ClaimSpec, ClaimStrategy } from './claim-strategy.js';
import type { EventOrder } from './event-order.js';
import { currentDelivery, runInIdempotencyContext } from './idempotency-context.js';
import { Propagation } from './propagation.js';

/**
 * What every transport runs a delivery through, once its spec and key are checked (the
 * decorators check theirs when they are applied, `IdempotencyService.run()` on each call): the
 * propagation decided, the claim made by the handler's strategy, the work run inside the
 * delivery's context (and, with nestjs-cls, its transactional plugin's). Internal: users call
 * `IdempotencyService.run()`, whose checks this skips.
 */
/** What some deliveries add to ClaimRunner.execute()'s claim; none of it is required. */
export interface DeliveryExtras {
  /** Key checks: the delivery's fingerprint, for handlers whose spec has checks. */
  readonly check?: ClaimCheck;
  /** The ordering guard: the delivery's entity and version, for handlers with `order`. */
  readonly order?: EventOrder;
  /** Where the delivery came from (the HTTP or RPC context, or a queue), for its span. */
  readonly origin?: DeliveryOrigin;
}

/** The extras of a delivery that has none: one object, not one per delivery. */
const NO_EXTRAS: DeliveryExtras = {};

@Injectable()
export class ClaimRunner implements OnModuleInit {
  private readonly logger = new Logger('IdempotencyModule');
  /** Makes the claim's transaction the one `@Transactional()` services join (nestjs-cls), if used. */
  private clsBridge?: ClsTransactionBridge;

  constructor(
    private readonly transaction: TransactionStrategy,
    private readonly lease: LeaseStrategy,
    @Inject(IDEMPOTENCY_CONFIG) private readonly config: IdempotencyConfig,
    private readonly database: ClaimDatabase,
    private readonly discovery: DiscoveryService,
    private readonly telemetry: DeliveryTelemetry,
  ) {}

  /** Finds nestjs-cls's transactional plugin on the claims' DataSource, if the app has it. */
  async onModuleInit(): Promise<void> {
    const providers = this.discovery.getProviders().map((wrapper) => wrapper.instance as unknown);
    this.clsBridge = await createClsTransactionBridge(this.database.dataSource, providers);
    if (this.clsBridge) this.logger.log(clsBridged(this.clsBridge.hosts));
  }

  /**
   * `execute()`, answered as a caller that is not a transport wants it: processed with its value,
   * replayed, or EventInFlightError.
   */
  async run<T>(
    spec: ClaimSpec,
    key: string,
    fn: (delivery: IdempotentDelivery) => T | Promise<T>,
  ): Promise<IdempotentRunResult<T>> {
    const result = await this.execute(spec, key, async (delivery) => fn(delivery));
    switch (result.kind) {
      case 'processed':
        return { status: 'processed', value: result.value };
      case 'replayed':
        return { status: 'replayed' };
      case 'in_flight':
      case 'conflict':
        // A conflict needs key checks, which run() and @Idempotent never have (the decorators do).
        throw claimRefusal(result, spec.scope, key, this.config);
      case 'stale':
        // Only @IdempotentWebhook takes an ordering guard, and it claims through execute().
        throw new Error(`${spec.scope} has no ordering guard, yet its claim was answered stale`);
    }
  }

  /**
   * The claim itself, for transports that answer each result their own way (the interceptor):
   * no error is made for an in-flight duplicate, which a storm answers many times a second. A
   * claim made while another delivery runs follows the spec's propagation (see Propagation).
   * `extras` carry what some deliveries add: key checks, the ordering guard, where it came from.
   */
  execute<T>(
    spec: ClaimSpec,
    key: string,
    work: (delivery: ClaimDelivery) => Promise<T>,
    extras: DeliveryExtras = NO_EXTRAS,
  ): Promise<ClaimResult<T>> {
    // Observability (lib/observability/delivery-telemetry.ts): the span and duration histograms.
    // Without prom-client and @opentelemetry/api, this check is all a delivery pays.
    if (this.telemetry.enabled) {
      return this.telemetry.observe(spec, key, extras.origin, work, (timed) =>
        this.claim(spec, key, timed, extras),
      );
    }
    return this.claim(spec, key, work, extras);
  }

  /** execute() without its telemetry. */
  private claim<T>(
    spec: ClaimSpec,
    key: string,
    work: (delivery: ClaimDelivery) => Promise<T>,
    { check, order }: DeliveryExtras,
  ): Promise<ClaimResult<T>> {
    const strategy: ClaimStrategy = spec.mode === 'external' ? this.lease : this.transaction;
    const run = (handle: ClaimHandle) => {
      const delivery = new ClaimDelivery(spec, key, handle);
      const bridge = this.clsBridge;
      // External mode holds no transaction for @Transactional() services to join.
      if (bridge === undefined || handle.manager === undefined) {
        return runInIdempotencyContext(delivery, () => work(delivery));
      }
      return bridge.run(handle.manager, () => runInIdempotencyContext(delivery, () => work(delivery)));
    };
    const enclosing = currentDelivery();
    if (enclosing === undefined && spec.propagation !== Propagation.Mandatory) {
      return strategy.run({ spec, key, work: run, check, order });
    }
    let joined: ClaimHandle | undefined;
    try {
      joined = this.enclosingHandle(spec, key, enclosing);
    } catch (error) {
      return Promise.reject(error);
    }
    return strategy.run({ spec, key, work: run, enclosing: joined, check, order });
  }

  /**
   * The handle of the delivery a claim made inside `enclosing` joins, or undefined when it claims
   * on its own; throws PropagationError where its propagation forbids the claim.
   */
  private enclosingHandle(
    spec: ClaimSpec,
    key: string,
    enclosing: IdempotentDelivery | undefined,
  ): ClaimHandle | undefined {
    const refuse = (message: string) => new PropagationError(message, spec.scope, key, enclosing?.scope);
    const { propagation } = spec;
    if (enclosing === undefined) throw refuse(noEnclosingDelivery(spec.scope));
    if (propagation === Propagation.Never) throw refuse(deliveryActive(spec.scope, enclosing.scope));
    if (propagation === Propagation.RequiresNew) return undefined;
    // An external-mode delivery holds no transaction: nothing to join.
    if (enclosing.mode !== 'transaction') {
      if (propagation === Propagation.Mandatory)
        throw refuse(noEnclosingDelivery(spec.scope, enclosing.scope));
      return undefined;
    }
    if (spec.mode !== 'transaction') throw refuse(leaseCannotJoin(spec.scope, enclosing.scope));
    return enclosing instanceof ClaimDelivery ? enclosing.handle : undefined;
  }
}

/** PropagationError: `mandatory` without an enclosing transaction-mode delivery. */
function noEnclosingDelivery(scope: string, enclosingScope?: string): string {
  const where = enclosingScope
    ? `inside ${enclosingScope}, an external-mode delivery, which holds no transaction`
    : 'outside any delivery';
  return `${scope} has propagation 'mandatory' and must join a transaction-mode delivery, but was called ${where}.`;
}

/** PropagationError: `never` inside a delivery. */
function deliveryActive(scope: string, enclosingScope: string): string {
  return `${scope} has propagation 'never' and was called inside the delivery of ${enclosingScope}.`;
}

/** PropagationError: an external-mode claim inside a transaction-mode delivery. */
function leaseCannotJoin(scope: string, enclosingScope: string): string {
  return (
    `${scope} runs in external mode and was called inside ${enclosingScope}, a transaction-mode ` +
    `delivery: a lease cannot join that transaction (it must commit at once, so that a duplicate ` +
    `sees it). Give ${scope} propagation: 'requiresNew' to claim on a connection of its own (each ` +
    `such delivery then holds two pool connections), or call it outside the transaction.`
  );
}

/** Logged at boot when `@Transactional()` services will join the claim's transaction. */
function clsBridged(hosts: number): string {
  return (
    `@nestjs-cls/transactional found on the claims' DataSource (${hosts} connection name${hosts === 1 ? '' : 's'}): ` +
    `@Transactional() services called from a transaction-mode handler join the claim's transaction`
  );
}
