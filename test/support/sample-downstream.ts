import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

/** One call the sample made to the fulfilment API. */
export interface FulfilmentCall {
  idempotencyKey: string | undefined;
  body: { eventId?: string; sessionId?: string; email?: string | null };
}

/** A call held open by `holdNext()`. */
export interface HeldCall {
  /** Resolves when the call has arrived (and been counted). */
  arrived: Promise<void>;
  /** Answers it with `status`. */
  release(status?: number): void;
}

type Plan = { kind: 'answer'; status: number } | { kind: 'reset' } | { kind: 'hold'; held: Deferred };

interface Deferred {
  arrive(): void;
  release: Promise<number>;
  answer(status: number): void;
}

/**
 * The fake FULFILMENT_URL: a real HTTP server that counts calls and records their Idempotency-Key
 * headers. By default it answers 200; a test can make the next call fail, reset, or hang.
 */
export class FakeFulfilmentApi {
  readonly calls: FulfilmentCall[] = [];
  private readonly plans: Plan[] = [];

  private readonly server: Server = createServer((request, response) => void this.handle(request, response));
  private address = '';

  private constructor() {}

  /** Where the sample is told to send fulfilments (FULFILMENT_URL). */
  get url(): string {
    return this.address;
  }

  static async start(): Promise<FakeFulfilmentApi> {
    const api = new FakeFulfilmentApi();
    await new Promise<void>((done) => api.server.listen(0, '127.0.0.1', done));
    const { port } = api.server.address() as { port: number };
    api.address = `http://127.0.0.1:${port}/fulfilments`;
    return api;
  }

  /** The next call is answered `status`. */
  answerNext(status: number): void {
    this.plans.push({ kind: 'answer', status });
  }

  /** The next call's connection is destroyed without an answer: a network error for the caller. */
  resetNext(): void {
    this.plans.push({ kind: 'reset' });
  }

  /** The next call hangs until released (or until its caller dies). */
  holdNext(): HeldCall {
    let arrive!: () => void;
    let answer!: (status: number) => void;
    const arrived = new Promise<void>((done) => (arrive = done));
    const release = new Promise<number>((done) => (answer = done));
    this.plans.push({ kind: 'hold', held: { arrive, release, answer } });
    return { arrived, release: (status = 200) => answer(status) };
  }

  /** Calls made for one Stripe event. */
  callsFor(eventId: string): FulfilmentCall[] {
    return this.calls.filter((call) => call.body.eventId === eventId);
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((done) => this.server.close(done));
  }

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    let raw = '';
    for await (const chunk of request) raw += chunk;
    const header = request.headers['idempotency-key'];
    this.calls.push({ idempotencyKey: Array.isArray(header) ? header[0] : header, body: JSON.parse(raw) });
    const plan = this.plans.shift() ?? { kind: 'answer', status: 200 };
    if (plan.kind === 'reset') {
      request.socket.destroy();
      return;
    }
    let status = plan.kind === 'answer' ? plan.status : 200;
    if (plan.kind === 'hold') {
      plan.held.arrive();
      status = await plan.held.release;
    }
    // The caller may have died while the call was held; there is no one left to answer.
    if (!response.destroyed) response.writeHead(status, { 'content-type': 'application/json' }).end('{}');
  }
}
