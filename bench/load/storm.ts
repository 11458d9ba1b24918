import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { ORDER_INSERT } from '../server/hand-written.sql.js';
import { SCOPES, type Variant } from '../variants.js';
import { keepAliveAgent, postJson, type PostAnswer } from './http-post.js';
import { openLoop } from './open-loop.js';
import { round, summarize, type LatencySummary } from './percentiles.js';
import { stripeEventBody } from './stripe-event.js';

/** Variants the storm can hold a claim for. */
export type StormVariant = Extract<Variant, 'lib-tx' | 'raw-tx' | 'lib-external' | 'raw-lease'>;

/** One duplicate storm. */
export interface StormOptions {
  url: string;
  databaseUrl: string;
  variant: StormVariant;
  /** How long the first delivery holds its claim before it commits. */
  holdMs: number;
  /** Length of the calm and of the storm phase of the unrelated stream. */
  windowMs: number;
  /** Unrelated events per second, sent open loop (one every 1/rate s, whatever the answers). */
  rate: number;
  duplicates: number;
  nextId: () => string;
  /** Samples of the server while the storm runs (lock waiters, pool queue). */
  probe: () => Promise<{ lockWaiters: number; poolWaiting: number; poolTotal: number }>;
}

/** What the storm did to the unrelated events, and what the duplicates were answered. */
export interface StormResult {
  variant: StormVariant;
  holdMs: number;
  rate: number;
  unrelatedCalm: LatencySummary & { non2xx: number };
  unrelatedStorm: LatencySummary & { non2xx: number };
  p99Ratio: number;
  duplicates: {
    sent: number;
    answers: Record<string, number>;
    replayedHeader: number;
    latencyMs: LatencySummary;
  };
  peak: { lockWaiters: number; poolWaiting: number; poolTotal: number };
  /** After the storm: order rows for the held key (1 expected) and its claim status. */
  effect: { orders: number; status: string | null };
}

/**
 * Holds one key's claim open through a separate connection, as a slow first delivery would, sends
 * `duplicates` concurrent deliveries of it plus an open-loop stream of unrelated events, and
 * compares the unrelated events' latency with a calm phase of the same stream.
 */
export async function runStorm(options: StormOptions): Promise<StormResult> {
  const agent = keepAliveAgent();
  const calm = await stream(options, agent, options.windowMs);

  const key = options.nextId();
  const holder = new pg.Client({ connectionString: options.databaseUrl });
  await holder.connect();
  const peak = { lockWaiters: 0, poolWaiting: 0, poolTotal: 0 };
  let probing = true;
  const probing$ = (async () => {
    while (probing) {
      const sample = await options.probe();
      peak.lockWaiters = Math.max(peak.lockWaiters, sample.lockWaiters);
      peak.poolWaiting = Math.max(peak.poolWaiting, sample.poolWaiting);
      peak.poolTotal = Math.max(peak.poolTotal, sample.poolTotal);
      await sleep(50);
    }
  })();
  try {
    const release = await hold(holder, options.variant, key);
    const unrelated = stream(options, agent, options.windowMs);
    await sleep(Math.min(300, options.windowMs / 10)); // the stream is flowing before the storm
    const duplicateAgent = keepAliveAgent(options.duplicates);
    const storm = Array.from({ length: options.duplicates }, (_, index) =>
      postJson(duplicateAgent, options.url, `/${options.variant}`, stripeEventBody(key, index)),
    );
    await sleep(options.holdMs);
    await release();
    const duplicates = await Promise.all(storm);
    const storming = await unrelated;
    duplicateAgent.destroy();
    return {
      variant: options.variant,
      holdMs: options.holdMs,
      rate: options.rate,
      unrelatedCalm: calm,
      unrelatedStorm: storming,
      p99Ratio: round(storming.p99 / Math.max(calm.p99, 0.01)),
      duplicates: {
        sent: duplicates.length,
        answers: countStatuses(duplicates),
        replayedHeader: duplicates.filter((answer) => answer.replayed).length,
        latencyMs: summarize(duplicates.map((answer) => answer.ms)),
      },
      peak,
      effect: await effectOf(holder, options.variant, key),
    };
  } finally {
    probing = false;
    await probing$;
    await holder.end();
    agent.destroy();
  }
}

/**
 * Takes the claim the way the first delivery would and returns how it finishes. Transaction
 * modes: an uncommitted claim + order row (duplicates block on its row lock). Lease modes: a
 * committed live lease (duplicates see in_progress), finished by the order row and `done`.
 */
async function hold(client: pg.Client, variant: StormVariant, key: string): Promise<() => Promise<void>> {
  const scope = SCOPES[variant];
  const orderRow = [key, variant, 'payment_intent.succeeded', 4200, 'eur', 'cus_storm'];
  if (variant === 'lib-tx' || variant === 'raw-tx') {
    await client.query('BEGIN');
    await client.query(
      `INSERT INTO processed_events (scope, event_key, source, status, completed_at) VALUES ($1, $2, 'stripe', 'done', now())`,
      [scope, key],
    );
    await client.query(ORDER_INSERT, orderRow);
    return async () => void (await client.query('COMMIT'));
  }
  await client.query(
    `INSERT INTO processed_events (scope, event_key, source, status, attempts, lease_token, claimed_at, lease_expires_at)
     VALUES ($1, $2, 'stripe', 'in_progress', 1, gen_random_uuid(), now(), now() + interval '5 minutes')`,
    [scope, key],
  );
  return async () => {
    await client.query('BEGIN');
    await client.query(ORDER_INSERT, orderRow);
    await client.query(
      `UPDATE processed_events SET status = 'done', completed_at = now() WHERE scope = $1 AND event_key = $2`,
      [scope, key],
    );
    await client.query('COMMIT');
  };
}

/** Unrelated events, open loop at `rate`/s for `ms`; latency counted from when each was due. */
async function stream(
  options: StormOptions,
  agent: ReturnType<typeof keepAliveAgent>,
  ms: number,
): Promise<LatencySummary & { non2xx: number }> {
  const answered = await openLoop({
    agent,
    url: options.url,
    path: `/${options.variant}`,
    rate: options.rate,
    ms,
    body: (sequence) => stripeEventBody(options.nextId(), sequence),
  });
  return {
    ...summarize(answered.map((answer) => answer.ms)),
    non2xx: answered.filter((answer) => answer.status < 200 || answer.status >= 300).length,
  };
}

function countStatuses(answers: PostAnswer[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const { status, replayed } of answers) {
    const label = `${status === 0 ? 'failed' : status}${replayed ? ' replayed' : ''}`;
    counts[label] = (counts[label] ?? 0) + 1;
  }
  return counts;
}

async function effectOf(client: pg.Client, variant: StormVariant, key: string) {
  const orders = await client.query('SELECT count(*)::int AS n FROM orders WHERE event_id = $1', [key]);
  const claim = await client.query(
    'SELECT status FROM processed_events WHERE scope = $1 AND event_key = $2',
    [SCOPES[variant], key],
  );
  return { orders: orders.rows[0].n as number, status: (claim.rows[0]?.status as string) ?? null };
}
