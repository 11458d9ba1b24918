import type { Provider, Type } from '@nestjs/common';
import type { ClaimStrategy } from '../core/claim-strategy.js';
import { registryProviders } from '../core/registry.providers.js';
import { LeaseStrategy } from './lease.strategy.js';
import { TransactionStrategy } from './transaction.strategy.js';

/**
 * Every claim mode, by the name handlers pick it with. A new mode is a strategy file and one entry
 * here; the `mode` option and its checks follow from this object.
 */
export const CLAIM_STRATEGIES = {
  /** Claim and handler writes in one transaction (seed "fix one"). The default. */
  transaction: TransactionStrategy,
  /** A fenced lease for work outside the database (seed "fix two"). */
  external: LeaseStrategy,
} satisfies Record<string, Type<ClaimStrategy>>;

/** The name of a claim mode: `'transaction'` (default) or `'external'`. */
export type IdempotencyMode = keyof typeof CLAIM_STRATEGIES;

/** The modes, for option checks and messages. */
export const IDEMPOTENCY_MODES = Object.keys(CLAIM_STRATEGIES) as IdempotencyMode[];

/** DI token of the strategy instances by mode. */
export const CLAIM_STRATEGY_REGISTRY = Symbol('CLAIM_STRATEGY_REGISTRY');

/** The strategies and the registry the service reads them from. */
export const claimStrategyProviders: Provider[] = registryProviders<ClaimStrategy>(
  CLAIM_STRATEGY_REGISTRY,
  CLAIM_STRATEGIES,
);
