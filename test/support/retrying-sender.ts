/**
 * A webhook sender as the providers run one, for the fault suite: every delivery is sent until
 * it gets a definitive answer (2xx), honouring Retry-After, and about 40% of all deliveries are
 * duplicates, some sent concurrently with the event's first delivery and some re-sent after the
 * event was already answered. Bounded in concurrency, in pace, and in total time.
 */

/** How a delivery relates to its event. */
export type DeliveryKind = 'first' | 'concurrent-copy' | 'resend';

/** Options of sendEvents. */
export interface SenderOptions {
  /** Base URLs of the app processes, read before each send: a restarted child listens elsewhere. */
  targets: () => readonly string[];
  /** The route, e.g. `/orders`. */
  path: string;
  /** Distinct events to deliver, at most (see RunningSender.finish). */
  events: number;
  /** Prefix of the event ids; unique per test, as the database is shared by a test file. */
  idPrefix: string;
  /** Share of all deliveries that are duplicates. @default 0.4 */
  duplicateShare?: number;
  /** Deliveries in flight at once. @default 8 */
  concurrency?: number;
  /** First deliveries started per second at most, so that the traffic spans the fault. */
  eventsPerSecond: number;
  /**
   * Retry-After is honoured with time compressed a hundredfold and bounded to these milliseconds:
   * a test cannot wait the 30 s a real sender would. @default { min: 50, max: 200 }
   */
  retryDelayMs?: { min: number; max: number };
  /** After this long from the start, a delivery without a definitive answer is given up. */
  deadlineMs: number;
  /** One send's own bound, in ms. @default 10_000 */
  requestTimeoutMs?: number;
  /** PRNG seed (printed with the report), so that a failing run can be replayed. @default random */
  seed?: number;
}

/** One answer (or transport failure) a send got. */
export interface SendOutcome {
  /** The HTTP status, or 0 for a transport failure (refused, reset, timed out). */
  status: number;
  /** Retry-After as sent, if any. */
  retryAfter?: string;
  /** The transport failure's code, or a 4xx/5xx answer's body, for the report. */
  detail?: string;
  replayed: boolean;
  target: string;
  /** Date.now() when the answer (or the failure) came. */
  at: number;
}

/** One delivery: every send it took, and how it ended. */
export interface DeliveryRecord {
  eventId: string;
  kind: DeliveryKind;
  sends: SendOutcome[];
  /** True once a send got a 2xx. */
  settled: boolean;
}

/** What the sender saw, for the fault report. */
export interface SenderResult {
  seed: number;
  /** Every event id, in order. */
  eventIds: string[];
  deliveries: DeliveryRecord[];
  elapsedMs: number;
}

/**
 * Answers that mean "deliver again later", and nothing else does: 503 and 409 (in flight), each
 * with Retry-After; a transport failure (status 0), as the process may be gone. A 500, a bare
 * 503 or any other 4xx is a bug under these faults; the sender retries it too, as a provider
 * would, and the report counts it.
 */
export function isRetryLater(outcome: SendOutcome): boolean {
  if (outcome.status === 0) return true;
  return (outcome.status === 503 || outcome.status === 409) && outcome.retryAfter !== undefined;
}

/** A sender at work: what it has seen so far (for a test to time its fault), and its result. */
export interface RunningSender {
  /** Every delivery started so far, updated as sends are answered. */
  readonly deliveries: readonly DeliveryRecord[];
  /** Distinct events acknowledged 2xx so far. */
  acknowledgedEvents(): number;
  /** Sends answered `status` so far (0: transport failures). */
  answered(status: number): number;
  /**
   * Starts no more events (those under way, their retries and re-sends go on): traffic that lasts
   * as long as a fault injector needs, however fast the machine.
   */
  finish(): void;
  /** Resolves once every delivery is answered 2xx or given up at the deadline. */
  readonly result: Promise<SenderResult>;
}

/**
 * Starts delivering `options.events` events, with duplicates, each delivery until it is
 * answered 2xx or the deadline passes.
 */
export function startSender(options: SenderOptions): RunningSender {
  const deliveries: DeliveryRecord[] = [];
  const control = { finished: false };
  return {
    deliveries,
    finish: () => {
      control.finished = true;
    },
    acknowledgedEvents: () => new Set(deliveries.filter((d) => d.settled).map((d) => d.eventId)).size,
    answered: (status) =>
      deliveries.reduce((n, d) => n + d.sends.filter((send) => send.status === status).length, 0),
    result: sendEvents(options, deliveries, control),
  };
}

async function sendEvents(
  options: SenderOptions,
  deliveries: DeliveryRecord[],
  control: { finished: boolean },
): Promise<SenderResult> {
  const seed = options.seed ?? Math.floor(Math.random() * 2 ** 31);
  const random = mulberry32(seed);
  const duplicateShare = options.duplicateShare ?? 0.4;
  const retryDelay = options.retryDelayMs ?? { min: 50, max: 200 };
  const requestTimeoutMs = options.requestTimeoutMs ?? 10_000;
  const started = Date.now();
  const deadline = started + options.deadlineMs;
  const limit = semaphore(options.concurrency ?? 8);

  const eventIds = Array.from({ length: options.events }, (_, i) => `${options.idPrefix}_${i}`);
  // Duplicates make up `duplicateShare` of all deliveries, spread at random over the events,
  // half of them concurrent with the first delivery and half re-sent once it was answered.
  const duplicates = Math.round((options.events * duplicateShare) / (1 - duplicateShare));
  const copies = new Map<string, DeliveryKind[]>();
  for (let i = 0; i < duplicates; i++) {
    const id = eventIds[Math.floor(random() * eventIds.length)];
    copies.set(id, [...(copies.get(id) ?? []), random() < 0.5 ? 'concurrent-copy' : 'resend']);
  }

  const running: Promise<void>[] = [];

  const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
  const send = async (record: DeliveryRecord): Promise<SendOutcome> => {
    const targets = options.targets();
    const target = targets[Math.floor(random() * targets.length)];
    try {
      const response = await fetch(`${target}${options.path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ id: record.eventId }),
        signal: AbortSignal.timeout(requestTimeoutMs),
      });
      const body = await response.text();
      return {
        status: response.status,
        retryAfter: response.headers.get('retry-after') ?? undefined,
        detail: response.status >= 400 ? body.slice(0, 200) : undefined,
        replayed: response.headers.get('idempotent-replayed') === 'true',
        target,
        at: Date.now(),
      };
    } catch (error) {
      const cause = (error as { cause?: { code?: string } }).cause;
      return {
        status: 0,
        detail: cause?.code ?? (error as Error).name,
        replayed: false,
        target,
        at: Date.now(),
      };
    }
  };
  /** Sends until a 2xx or the deadline; resolves when the delivery is over either way. */
  const deliver = async (record: DeliveryRecord): Promise<void> => {
    while (Date.now() < deadline) {
      const outcome = await send(record);
      record.sends.push(outcome);
      if (outcome.status >= 200 && outcome.status < 300) {
        record.settled = true;
        return;
      }
      const seconds = Number(outcome.retryAfter ?? 1);
      const scaled = Math.min(retryDelay.max, Math.max(retryDelay.min, (seconds * 1000) / 100));
      // Jitter, so that retries of concurrent copies do not march in step.
      await pause(scaled * (0.75 + random() * 0.5));
    }
  };
  const start = (eventId: string, kind: DeliveryKind, after?: () => void) => {
    const record: DeliveryRecord = { eventId, kind, sends: [], settled: false };
    deliveries.push(record);
    running.push(
      limit(() => deliver(record)).then(() => {
        if (record.settled) after?.();
      }),
    );
  };

  let startedEvents = 0;
  for (let i = 0; i < eventIds.length; i++) {
    // Pacing a load generator: the i-th event starts no earlier than its slot.
    const slot = started + (i * 1000) / options.eventsPerSecond;
    if (slot > Date.now()) await pause(slot - Date.now());
    if (control.finished || Date.now() >= deadline) break;
    startedEvents++;
    const id = eventIds[i];
    const extra = copies.get(id) ?? [];
    const resends = extra.filter((kind) => kind === 'resend').length;
    start(id, 'first', () => {
      // A provider re-sends an answered event some time later; within the test's bound.
      for (let r = 0; r < resends; r++) running.push(pause(random() * 300).then(() => start(id, 'resend')));
    });
    for (const kind of extra) if (kind === 'concurrent-copy') start(id, kind);
  }
  // Re-sends are started as first deliveries settle: wait until no more can appear.
  for (let seen = 0; seen < running.length;) {
    const batch = running.slice(seen);
    seen = running.length;
    await Promise.all(batch);
  }
  return { seed, eventIds: eventIds.slice(0, startedEvents), deliveries, elapsedMs: Date.now() - started };
}

/** A FIFO limit of `size` tasks at once. */
function semaphore(size: number): <T>(task: () => Promise<T>) => Promise<T> {
  let active = 0;
  const waiting: (() => void)[] = [];
  return async (task) => {
    if (active >= size) await new Promise<void>((resolve) => waiting.push(resolve));
    else active++;
    try {
      return await task();
    } finally {
      const next = waiting.shift();
      if (next) next();
      else active--;
    }
  };
}

/** A small seeded PRNG: the same seed gives the same duplicates and targets. */
function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
