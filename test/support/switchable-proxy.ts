import { connect, createServer, type Socket } from 'node:net';

/**
 * A loopback TCP proxy that passes bytes through unread, with two controls a failover test needs:
 *
 * - `switchTo(port)`: where new connections go from now on. In front of an app's database it is
 *   the endpoint that moves on a failover (a DNS name, a virtual IP, a cloud "writer endpoint"):
 *   the app keeps its DATABASE_URL and is not restarted; connections it opens after the switch
 *   reach the promoted standby, and the ones it had died with the old primary.
 * - `pause()` / `resume()`: every connection stops moving bytes, both ways, until resumed (new
 *   ones too). In front of a standby's WAL stream it holds back, deterministically, everything
 *   the primary writes from that moment: a standby that lags by exactly what the test chose.
 *   `close()` drops whatever was held, so a promoted standby never gets it.
 *
 * Unlike tcp-proxy.ts it does not parse the PostgreSQL protocol: the replication protocol is not
 * what that proxy reads, and an endpoint switch does not look inside the stream either.
 */
export interface SwitchableProxy {
  /** The loopback port the proxy listens on. */
  readonly port: number;
  /** The port new connections are sent to. */
  readonly target: number;
  /** `databaseUrl` with its host and port replaced by the proxy's. */
  url(databaseUrl: string): string;
  /** Sends new connections to `port` on 127.0.0.1; open ones stay where they are. */
  switchTo(port: number): void;
  /** Stops every connection's bytes, both ways (new connections are held from the start). */
  pause(): void;
  /** Lets held bytes, and everything after them, through again. */
  resume(): void;
  /** Connections currently open through the proxy. */
  readonly openConnections: number;
  /** Stops listening and destroys every connection; bytes held by pause() are dropped. */
  close(): Promise<void>;
}

/** Starts a proxy on a free loopback port, sending connections to 127.0.0.1:`targetPort`. */
export async function startSwitchableProxy(targetPort: number): Promise<SwitchableProxy> {
  let target = targetPort;
  let paused = false;
  const open = new Set<Socket[]>();

  const server = createServer((client) => {
    const upstream = connect(target, '127.0.0.1');
    const pair = [client, upstream];
    open.add(pair);
    if (paused) for (const socket of pair) socket.pause();
    pump(client, upstream, () => paused);
    pump(upstream, client, () => paused);
    // Either side going away (a killed server, a closed client) takes the other with it.
    const end = () => {
      if (!open.delete(pair)) return;
      for (const socket of pair) socket.destroy();
    };
    for (const socket of pair) {
      socket.on('error', end);
      socket.on('close', end);
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as { port: number }).port;

  return {
    port,
    get target() {
      return target;
    },
    url(databaseUrl) {
      const url = new URL(databaseUrl);
      url.hostname = '127.0.0.1';
      url.port = String(port);
      return url.toString();
    },
    switchTo(next) {
      target = next;
    },
    pause() {
      paused = true;
      for (const pair of open) for (const socket of pair) socket.pause();
    },
    resume() {
      paused = false;
      for (const pair of open) for (const socket of pair) socket.resume();
    },
    get openConnections() {
      return open.size;
    },
    async close() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const pair of open) for (const socket of pair) socket.destroy();
      open.clear();
      await closed;
    },
  };
}

/**
 * Copies `from` into `to`, by hand rather than with pipe(): a pipe resumes its source on the
 * destination's 'drain', which would undo a pause(). Backpressure still holds: a full `to` pauses
 * `from` until it drains, and only a proxy that is not paused resumes it then.
 */
function pump(from: Socket, to: Socket, paused: () => boolean): void {
  from.on('data', (chunk: Buffer) => {
    if (to.write(chunk)) return;
    from.pause();
    to.once('drain', () => {
      if (!paused()) from.resume();
    });
  });
}
