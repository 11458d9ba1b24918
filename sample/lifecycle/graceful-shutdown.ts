import type { Server } from 'node:http';
import { Logger, type INestApplication } from '@nestjs/common';
import type { SampleDatabase } from '../database/sample-database.js';

/** How long in-flight requests get to finish after SIGTERM. */
export const DRAIN_MS = 10_000;
/** After the drain, how long the rest of the close (hooks, pool) may take once connections are cut. */
const FORCED_CLOSE_MS = 5_000;
/** How often connections left idle by finished requests are dropped while draining. */
const IDLE_SWEEP_MS = 100;

/**
 * SIGTERM, SIGINT (Ctrl-C) or SIGHUP: refuse new requests, let in-flight ones finish (up to
 * DRAIN_MS), close the app, then stop the embedded database, then exit 0.
 *
 * Not `app.enableShutdownHooks()`: Nest's handler re-raises the signal (exit status 143) or exits
 * as soon as the app has closed, leaving no moment to stop an embedded Postgres after the app and
 * its connection pool are gone. `app.close()` runs the same lifecycle hooks.
 */
export class GracefulShutdown {
  private readonly logger = new Logger('Shutdown');
  private app?: INestApplication;
  private database?: SampleDatabase;
  private stopping = false;

  /** Starts listening for the signals; call it before starting anything that must be stopped. */
  listen(signals: NodeJS.Signals[] = ['SIGTERM', 'SIGINT', 'SIGHUP']): this {
    for (const signal of signals) process.on(signal, () => void this.stop(signal));
    return this;
  }

  /** What to close on the way out, as each part comes up. */
  manage(parts: { app?: INestApplication; database?: SampleDatabase }): void {
    this.app = parts.app ?? this.app;
    this.database = parts.database ?? this.database;
  }

  /** Closes everything it manages in order and exits: 0 after a clean drain, 1 otherwise. */
  async stop(reason: string, exitCode = 0): Promise<void> {
    if (this.stopping) {
      this.logger.warn(`${reason}: already shutting down`);
      return;
    }
    this.stopping = true;
    let code = exitCode;
    if (this.app && !(await this.closeApp(this.app, reason))) code = 1;
    try {
      await this.database?.stop();
    } catch (error) {
      this.logger.error(`Stopping the database failed: ${message(error)}`);
      code = 1;
    }
    process.exit(code);
  }

  private async closeApp(app: INestApplication, reason: string): Promise<boolean> {
    this.logger.log(
      `${reason}: refusing new requests, letting in-flight ones finish (up to ${DRAIN_MS / 1000} s)`,
    );
    const server = app.getHttpServer() as Server;
    // server.close() drops idle keep-alive connections only once; a connection whose request
    // finishes later would hold the close open for the whole keep-alive timeout.
    const sweep = setInterval(() => server.closeIdleConnections(), IDLE_SWEEP_MS);
    // `return503OnClosing` (main.ts) answers requests arriving from now on with 503.
    const closing = app.close().then(
      () => true,
      (error: unknown) => {
        this.logger.error(`Closing the app failed: ${message(error)}`);
        return false;
      },
    );
    try {
      const drained = await settledWithin(closing, DRAIN_MS);
      if (drained !== undefined) {
        if (drained) this.logger.log('In-flight requests finished; app closed');
        return drained;
      }
      // Requests cut off here are safe for the sender to retry: a transaction claim rolls back
      // with its connection, a lease expires and is taken over.
      this.logger.warn(`Requests still running after ${DRAIN_MS / 1000} s: closing their connections`);
      server.closeAllConnections();
      await settledWithin(closing, FORCED_CLOSE_MS);
      return false;
    } finally {
      clearInterval(sweep);
    }
  }
}

/** The promise's value if it settles within `ms`, else undefined. */
function settledWithin<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<undefined>((done) => (timer = setTimeout(() => done(undefined), ms)));
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
