import { loadOptionalPeer } from '../../core/optional-peer.js';
/**
 * The part of pg-boss 10's API the handoff uses, typed here so that pg-boss stays an optional
 * peer: nothing imports it until a module with a `handoff` option starts.
 */
import type { SqlExecutor } from '../../core/claim-strategy.js';
import { describeError } from '../../idempotency.messages.js';

const pgBossMissing = (error: unknown) =>
  `IdempotencyModule option handoff needs pg-boss, an optional peer dependency (npm install pg-boss@^10.4): ${describeError(error)}`;

/** A job as pg-boss's fetch() returns it with `includeMetadata: true` (the fields read here). */
export interface PgBossJob {
  id: string;
  name: string;
  data: unknown;
  /** Retries so far: 0 on the first attempt. */
  retryCount: number;
  /** Retries allowed; once retryCount reaches it, a failure is final (dead letter). */
  retryLimit: number;
}

/** Options pg-boss's createQueue/updateQueue take. */
export interface PgBossQueueOptions {
  retryLimit?: number;
  retryDelay?: number;
  retryBackoff?: boolean;
  expireInSeconds?: number;
  deadLetter?: string;
}

/** The pg-boss instance, as used here. */
export interface PgBoss {
  on(event: 'error', listener: (error: unknown) => void): unknown;
  start(): Promise<unknown>;
  stop(options: { graceful?: boolean; close?: boolean; wait?: boolean; timeout?: number }): Promise<void>;
  createQueue(name: string, options: PgBossQueueOptions): Promise<void>;
  updateQueue(name: string, options: PgBossQueueOptions): Promise<void>;
  send(
    name: string,
    data: unknown,
    options: { db: SqlExecutor; id?: string; startAfter?: number; priority?: number },
  ): Promise<string | null>;
  fetch(name: string, options: { batchSize: number; includeMetadata: true }): Promise<PgBossJob[] | null>;
  complete(name: string, id: string, data?: unknown, options?: { db?: SqlExecutor }): Promise<unknown>;
  fail(name: string, id: string, data?: unknown, options?: { db?: SqlExecutor }): Promise<unknown>;
}

/** What the handoff constructs pg-boss with. */
export interface PgBossOptions {
  db: SqlExecutor;
  schema: string;
  migrate: boolean;
  supervise: boolean;
  schedule: boolean;
  maintenanceIntervalSeconds: number;
}

/** pg-boss's default export. */
export type PgBossConstructor = new (options: PgBossOptions) => PgBoss;

/** Loads pg-boss, or fails the boot saying how to install it. */
export async function loadPgBoss(): Promise<PgBossConstructor> {
  try {
    // pg-boss 10 is CommonJS: required, it is the class itself; imported, the class is its default.
    const module = await loadOptionalPeer<PgBossConstructor | { default: PgBossConstructor }>('pg-boss');
    return typeof module === 'function' ? module : module.default;
  } catch (error) {
    throw new Error(pgBossMissing(error), { cause: error });
  }
}
