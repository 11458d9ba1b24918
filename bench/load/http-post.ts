import { Agent, request } from 'node:http';

/** One answered POST. */
export interface PostAnswer {
  status: number;
  /** From the moment the request was due to be sent (open loop), not when a socket was free. */
  ms: number;
  replayed: boolean;
}

/** Keep-alive connections for open-loop senders; enough that sockets never queue requests. */
export function keepAliveAgent(maxSockets = 256): Agent {
  return new Agent({ keepAlive: true, maxSockets });
}

/** POSTs a JSON body and resolves when the answer is read (status 0: the request failed). */
export function postJson(
  agent: Agent,
  url: string,
  path: string,
  body: string,
  dueAt = performance.now(),
  /** The event's id, sent as the request mode's `Idempotency-Key` (webhook routes ignore it). */
  key?: string,
) {
  return new Promise<PostAnswer>((resolve) => {
    const target = new URL(path, url);
    const req = request(
      target,
      {
        method: 'POST',
        agent,
        headers: {
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(body),
          ...(key === undefined ? {} : { 'idempotency-key': `"${key}"` }),
        },
      },
      (res) => {
        res.resume();
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            ms: performance.now() - dueAt,
            replayed: res.headers['idempotent-replayed'] === 'true',
          }),
        );
      },
    );
    req.on('error', () => resolve({ status: 0, ms: performance.now() - dueAt, replayed: false }));
    req.end(body);
  });
}
