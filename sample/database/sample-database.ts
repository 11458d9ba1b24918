import { Logger } from '@nestjs/common';
import type { SampleConfig } from '../config/sample-config.js';
import { startEmbeddedPostgres } from './embedded-postgres.js';

/** The database the sample runs on, and how to let go of it at shutdown. */
export interface SampleDatabase {
  url: string;
  /** True when the sample started the server itself (and so must stop it). */
  embedded: boolean;
  /** Stops an embedded server; nothing for DATABASE_URL. Call it after the app has closed. */
  stop(): Promise<void>;
}

/** DATABASE_URL when set; otherwise an embedded PostgreSQL the sample starts and stops. */
export async function openSampleDatabase(config: SampleConfig): Promise<SampleDatabase> {
  if (!config.databaseUrl) return startEmbeddedPostgres();
  const { host, pathname } = new URL(config.databaseUrl);
  // Only where it points: the URL may carry a password.
  new Logger('Database').log(`Using DATABASE_URL (${host}${pathname})`);
  return { url: config.databaseUrl, embedded: false, stop: async () => undefined };
}
