import autocannon from 'autocannon';
import { DUPLICATE_SHARE, type Variant, type Workload } from '../variants.js';
import { summarize, type LatencySummary } from './percentiles.js';
import { stripeEventBody } from './stripe-event.js';

/** Events a duplicate may repeat: the most recent answered ones. */
const RECENT_KEYS = 2_000;

/** An event as it was sent: a retry resends these very bytes, as a sender does. */
interface SentEvent {
  id: string;
  body: string;
}

/** One closed-loop load run against one variant. */
export interface LoadOptions {
  url: string;
  variant: Variant;
  workload: Workload;
  durationS: number;
  connections: number;
  /** Generates this run's unique event ids. */
  nextId: () => string;
}

/** What the load process saw. */
export interface LoadResult {
  durationS: number;
  responses: number;
  eventsPerSecond: number;
  latencyMs: LatencySummary;
  statuses: Record<string, number>;
  /** Socket errors and timeouts (autocannon counts a timeout as an error too). */
  errors: number;
  timeouts: number;
  non2xx: number;
  duplicatesSent: number;
  /** Distinct event ids answered 2xx: each must have its order row (checked, then dropped from the JSON). */
  answeredIds: string[];
}

/**
 * Runs autocannon with keep-alive connections, each request a ~1 KB Stripe-shaped event with an
 * id made in this process. `dup30`: 30% of requests repeat the id of an event already answered
 * 2xx (a sender retrying after a lost answer); concurrent duplicates are the storm's business.
 */
export async function runLoad(options: LoadOptions): Promise<LoadResult> {
  const recent: SentEvent[] = [];
  const answered = new Set<string>();
  let sequence = 0;
  let duplicatesSent = 0;
  const latencies: number[] = [];
  const instance = autocannon({
    url: options.url,
    connections: options.connections,
    duration: options.durationS,
    timeout: 30,
    // autocannon stops at its next sample tick; 100 ms ticks keep short runs short.
    sampleInt: 100,
    requests: [
      {
        method: 'POST',
        path: `/${options.variant}`,
        headers: { 'content-type': 'application/json' },
        setupRequest(request, context) {
          let event: SentEvent;
          if (options.workload === 'dup30' && recent.length > 0 && Math.random() < DUPLICATE_SHARE) {
            // The same body as the first copy: a retry, not a key reused for another request
            // (which the key checks would count as a conflict and the request mode refuse 422).
            event = recent[Math.floor(Math.random() * recent.length)];
            duplicatesSent++;
          } else {
            const id = options.nextId();
            event = { id, body: stripeEventBody(id, sequence++) };
          }
          // One request in flight per connection: the context carries its event to onResponse.
          context.event = event;
          // Every variant gets the request mode's header (an sf-string); webhook routes ignore it.
          const headers = { ...request.headers, 'idempotency-key': `"${event.id}"` };
          return { ...request, headers, body: event.body };
        },
        onResponse(status, _body, context) {
          if (status < 200 || status >= 300) return;
          const event = context.event as SentEvent;
          answered.add(event.id);
          if (recent.length < RECENT_KEYS) recent.push(event);
          else recent[sequence % RECENT_KEYS] = event;
        },
      },
    ],
  });
  // autocannon's own histogram keeps whole milliseconds; the raw times keep the fractions.
  instance.on('response', (_client: unknown, _status: number, _bytes: number, ms: number) =>
    latencies.push(ms),
  );
  const result = await instance;
  const statuses = Object.fromEntries(
    Object.entries(result.statusCodeStats).map(([code, { count }]) => [code, count]),
  );
  return {
    durationS: result.duration,
    responses: latencies.length,
    eventsPerSecond: Math.round(latencies.length / result.duration),
    latencyMs: summarize(latencies),
    statuses,
    errors: result.errors,
    timeouts: result.timeouts,
    non2xx: result.non2xx,
    duplicatesSent,
    answeredIds: [...answered],
  };
}
