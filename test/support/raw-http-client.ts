import http from 'node:http';

/** A request as it goes on the wire: header values as given (an array sends the header once per value). */
export interface RawRequest {
  path: string;
  headers: Record<string, string | string[]>;
  /** Sent with its exact length; none sends no body and no Content-Length. */
  body?: Buffer;
}

/** An answer: its status, headers, and body (parsed when it is JSON). */
export interface RawResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  json: unknown;
}

/**
 * A keep-alive HTTP/1.1 client on one loopback origin that sends bytes and headers exactly as
 * given (supertest re-encodes bodies and opens a connection per request, which costs a property
 * test of thousands of cases most of its time). One socket: deliveries go one at a time.
 */
export class RawHttpClient {
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  private readonly origin: URL;

  constructor(
    url: string,
    private readonly timeoutMs = 10_000,
  ) {
    this.origin = new URL(url);
  }

  /** POSTs `request`; rejects on a connection error or after `timeoutMs` without an answer. */
  post(request: RawRequest): Promise<RawResponse> {
    return new Promise((resolve, reject) => {
      const headers: http.OutgoingHttpHeaders = { ...request.headers };
      if (request.body) headers['content-length'] = String(request.body.length);
      const outgoing = http.request(
        {
          agent: this.agent,
          host: this.origin.hostname,
          port: this.origin.port,
          method: 'POST',
          path: request.path,
          headers,
          timeout: this.timeoutMs,
        },
        (incoming) => {
          // Fastify answers 431 (header section too large) without `Connection: close` and then
          // drops the connection: reused, the socket would fail the next request.
          const socket = incoming.socket;
          const chunks: Buffer[] = [];
          incoming.on('data', (chunk: Buffer) => chunks.push(chunk));
          incoming.on('error', reject);
          incoming.on('end', () => {
            if (incoming.statusCode === 431) socket.destroy();
            const text = Buffer.concat(chunks).toString('utf8');
            let json: unknown;
            try {
              json = JSON.parse(text);
            } catch {
              json = undefined;
            }
            resolve({ status: incoming.statusCode ?? 0, headers: incoming.headers, text, json });
          });
        },
      );
      outgoing.on('timeout', () =>
        outgoing.destroy(new Error(`no answer to POST ${request.path} within ${this.timeoutMs} ms`)),
      );
      outgoing.on('error', reject);
      outgoing.end(request.body);
    });
  }

  /** Closes the kept-alive socket. */
  close(): void {
    this.agent.destroy();
  }
}
