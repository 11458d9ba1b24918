import { FaultsFixtureModule, type FaultSettings } from '../fixtures/faults.fixture.js';
import { startApp, type AdapterName, type RunningApp } from './app.js';
import { CountingDownstream } from './counting-downstream.js';
import type { TestDatabase } from './database.js';
import { createFaultDatabase } from './fault-database.js';
import { startPostgres, type PostgresServer } from './postgres-server.js';

/**
 * What a fault spec (test/faults/) breaks: the faults app on its fault database, calling a
 * CountingDownstream, and, for a spec that stops PostgreSQL, a server of its own.
 */
export interface FaultApp {
  /** The spec's own server (`ownServer: true`): `halt()` and `resume()` restart it under the app. */
  server?: PostgresServer;
  db: TestDatabase;
  downstream: CountingDownstream;
  running: RunningApp;
  /** Closes the app, the downstream and the database, then stops the spec's own server. */
  close(): Promise<void>;
}

/** Options of startFaultApp. */
export interface FaultAppOptions extends Pick<FaultSettings, 'applicationName' | 'idempotency'> {
  adapter: AdapterName;
  /** The downstream's answer time: how long external mode's handler runs. */
  downstreamLatencyMs: number;
  /**
   * A PostgreSQL server for this spec alone, whatever DATABASE_URL says: one it may stop.
   * @default false (the run's server)
   */
  ownServer?: boolean;
  /**
   * The URL the app connects with, for a spec that puts something between the app and the
   * database (a proxy that cuts connections).
   * @default the database's own URL
   */
  appDatabaseUrl?: (db: TestDatabase) => Promise<string>;
}

/** Starts a fault spec's system (FaultApp); on a failed start, closes what did start. */
export async function startFaultApp(options: FaultAppOptions): Promise<FaultApp> {
  const started: Partial<FaultApp> = {};
  const close = async () => {
    await started.running?.close();
    await started.downstream?.close();
    await started.db?.drop();
    await started.server?.stop();
  };
  try {
    if (options.ownServer) started.server = await startPostgres({ reuseDatabaseUrl: false });
    const db = (started.db = await createFaultDatabase(started.server?.adminUrl));
    const databaseUrl = options.appDatabaseUrl ? await options.appDatabaseUrl(db) : db.url;
    const downstream = (started.downstream = await CountingDownstream.start({
      latencyMs: options.downstreamLatencyMs,
    }));
    started.running = await startApp(options.adapter, [
      FaultsFixtureModule.forDatabase({
        databaseUrl,
        downstreamUrl: downstream.url,
        applicationName: options.applicationName,
        idempotency: options.idempotency,
      }),
    ]);
    return { ...(started as Omit<FaultApp, 'close'>), close };
  } catch (error) {
    await close();
    throw error;
  }
}
