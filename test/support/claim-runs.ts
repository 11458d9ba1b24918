import type { INestApplicationContext } from '@nestjs/common';
import { DataSource } from 'typeorm';
import { IdempotencyService, type IdempotentRunResult } from '../../lib/index.js';

/** A delivery's effect: one `downstream_calls` row with the attempt that made it. */
const EFFECT = 'INSERT INTO downstream_calls (event_id, attempt) VALUES ($1, $2)';

/** How `runDelivery` behaves. */
export interface RunBehaviour {
  /** Throw instead of making the effect: the claim is marked failed. */
  fail?: boolean;
  /** The external-mode lease of this delivery. @default the module's leaseMs */
  leaseMs?: number;
  /** Renew the lease every leaseMs / 3 while it runs. */
  heartbeat?: boolean;
}

const claimOptions = (scope: string, key: string, behaviour: RunBehaviour) => ({
  scope,
  key,
  mode: 'external' as const,
  leaseMs: behaviour.leaseMs,
  heartbeat: behaviour.heartbeat,
});

/**
 * One external-mode delivery of `key` under `scope` through the app's IdempotencyService.run, any
 * scope the test likes: its effect is one `downstream_calls` row, autocommitted through the app's
 * DataSource as an external call would be (see `downstreamCalls`). Resolves with the attempt that
 * ran, or `replayed`.
 */
export async function runDelivery(
  app: INestApplicationContext,
  scope: string,
  key: string,
  behaviour: RunBehaviour = {},
): Promise<number | 'replayed'> {
  const dataSource = app.get(DataSource);
  const result: IdempotentRunResult<number> = await app
    .get(IdempotencyService)
    .run(claimOptions(scope, key, behaviour), async ({ attempt }) => {
      if (behaviour.fail) throw new Error(`${key} failed on purpose`);
      await dataSource.query(EFFECT, [key, attempt]);
      return attempt!;
    });
  return result.status === 'processed' ? result.value : 'replayed';
}

/** A delivery parked after its claim, before its effect, until the test opens it. */
export interface ParkedRun {
  /** Its outcome once opened: the attempt, or the error it was answered with. */
  result: Promise<number | Error>;
  open(): void;
}

/** Starts a delivery like `runDelivery` that parks after its claim; resolves once it holds the claim. */
export async function parkRun(
  app: INestApplicationContext,
  scope: string,
  key: string,
  behaviour: RunBehaviour = {},
): Promise<ParkedRun> {
  const dataSource = app.get(DataSource);
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  let claimed!: () => void;
  const arrived = new Promise<void>((resolve) => (claimed = resolve));
  const result = app
    .get(IdempotencyService)
    .run(claimOptions(scope, key, behaviour), async ({ attempt }) => {
      claimed();
      await gate;
      if (behaviour.fail) throw new Error(`${key} failed on purpose`);
      await dataSource.query(EFFECT, [key, attempt]);
      return attempt!;
    })
    .then(
      (outcome) => (outcome.status === 'processed' ? outcome.value : new Error('replayed')),
      (error: Error) => error,
    );
  // A claim refused (in flight, a bad key) never reaches the gate: fail instead of waiting forever.
  await Promise.race([arrived, result.then((outcome) => Promise.reject(outcome))]);
  return { result, open };
}
