import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

/** Headers the fault fixture's handler sends with each downstream call. */
export const CALLER_PID_HEADER = 'x-caller-pid';
export const ATTEMPT_HEADER = 'x-attempt';

/** One call the downstream received. */
export interface DownstreamCall {
  eventId: string;
  /** The Idempotency-Key header: a real downstream (Stripe, say) dedupes on it. */
  idempotencyKey: string | undefined;
  /** The process that made the call: tells a call from a process later SIGKILLed. */
  callerPid: number | undefined;
  /** The lease attempt the call was made under (1, then +1 per re-claim). */
  attempt: number | undefined;
  /** Date.now() when the call arrived. */
  at: number;
}

/**
 * The external system of external mode: a real HTTP server on 127.0.0.1 that counts calls per
 * event and records the Idempotency-Key each carried. It counts on arrival, before it answers, so a
 * caller that dies waiting for the answer has still made its call. It always answers 200: the faults
 * under test are the app's and the database's, not the downstream's.
 */
export class CountingDownstream {
  readonly calls: DownstreamCall[] = [];
  private readonly server: Server = createServer((request, response) => void this.handle(request, response));
  private address = '';

  private constructor(private readonly latencyMs: number) {}

  /**
   * Starts the server on a free loopback port. `latencyMs` is how long each call takes to answer
   * (a real API's latency): the time a fault has to catch a handler between its call and its
   * completion.
   */
  static async start(options: { latencyMs?: number } = {}): Promise<CountingDownstream> {
    const downstream = new CountingDownstream(options.latencyMs ?? 0);
    await new Promise<void>((done) => downstream.server.listen(0, '127.0.0.1', done));
    const { port } = downstream.server.address() as { port: number };
    downstream.address = `http://127.0.0.1:${port}/calls`;
    return downstream;
  }

  /** Where the app is told to send its calls (POST, JSON `{ eventId }`). */
  get url(): string {
    return this.address;
  }

  /** The calls made for `eventId`, in arrival order. */
  callsFor(eventId: string): DownstreamCall[] {
    return this.calls.filter((call) => call.eventId === eventId);
  }

  /** Calls per event id. */
  countsByEvent(): Map<string, number> {
    const counts = new Map<string, number>();
    for (const call of this.calls) counts.set(call.eventId, (counts.get(call.eventId) ?? 0) + 1);
    return counts;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((done) => this.server.close(done));
  }

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    let raw = '';
    for await (const chunk of request) raw += chunk;
    const header = (name: string) => {
      const value = request.headers[name];
      return Array.isArray(value) ? value[0] : value;
    };
    const number = (value: string | undefined) => (value === undefined ? undefined : Number(value));
    this.calls.push({
      eventId: String((JSON.parse(raw) as { eventId?: unknown }).eventId),
      idempotencyKey: header('idempotency-key'),
      callerPid: number(header(CALLER_PID_HEADER)),
      attempt: number(header(ATTEMPT_HEADER)),
      at: Date.now(),
    });
    if (this.latencyMs > 0) await new Promise((resolve) => setTimeout(resolve, this.latencyMs));
    // The caller may have died while the call took its time; there is no one left to answer.
    if (response.destroyed) return;
    response.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
  }
}
