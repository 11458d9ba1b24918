import type { Provider } from '@nestjs/common';
import { LeaseStrategy } from './lease.strategy.js';
import { TransactionStrategy } from './transaction.strategy.js';

/**
 * The name of a claim mode: `'transaction'` (the default: claim and handler writes in one
 * transaction) or `'external'` (a fenced lease for work outside the database).
 */
export type IdempotencyMode = 'transaction' | 'external';

/** The modes, for option checks and messages. */
export const IDEMPOTENCY_MODES: readonly IdempotencyMode[] = ['transaction', 'external'];

/** The strategies, one per mode; ClaimRunner chooses by the handler's mode. */
export const claimStrategyProviders: Provider[] = [TransactionStrategy, LeaseStrategy];
