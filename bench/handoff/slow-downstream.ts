import { createServer, type Server } from 'node:http';

/** The downstream both the inline handler and the handoff's worker call: 300 ms per call. */
export class SlowDownstream {
  calls = 0;
  private readonly server: Server;
  private address = '';

  private constructor(private readonly delayMs: number) {
    this.server = createServer((request, response) => {
      request.resume();
      request.on('end', () => {
        this.calls++;
        setTimeout(
          () => response.writeHead(200, { 'content-type': 'application/json' }).end('{}'),
          this.delayMs,
        );
      });
    });
    // 32 connections of the inline route plus the worker's: no keep-alive limit in the way.
    this.server.keepAliveTimeout = 60_000;
  }

  /** Where the server is told to send its calls. */
  get url(): string {
    return this.address;
  }

  static async start(delayMs: number): Promise<SlowDownstream> {
    const downstream = new SlowDownstream(delayMs);
    await new Promise<void>((done) => downstream.server.listen(0, '127.0.0.1', done));
    const { port } = downstream.server.address() as { port: number };
    downstream.address = `http://127.0.0.1:${port}/fulfil`;
    return downstream;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((done) => this.server.close(done));
  }
}
