import type { AsyncCounts } from '../server/async-counter.js';
import type { QueryCounts, TracedQuery } from '../server/query-counter.js';

/** What the bench runner asks its server process over the IPC channel. */
export type ServerCommand =
  | { cmd: 'reset' }
  | { cmd: 'stats' }
  | { cmd: 'trace-start' }
  | { cmd: 'trace-stop' }
  | { cmd: 'count-start' }
  | { cmd: 'count-stop' }
  | { cmd: 'profile-start' }
  | { cmd: 'profile-stop'; path: string }
  | { cmd: 'shutdown' };

/** The server's counters since the last reset. */
export interface ServerStats {
  queries: QueryCounts;
  /** Requests received and answered by the HTTP server, whatever the adapter. */
  requests: number;
  answered: number;
  inFlight: number;
  statuses: Record<string, number>;
  /** process.cpuUsage() since the reset, in microseconds. */
  cpuUserUs: number;
  cpuSystemUs: number;
  elapsedMs: number;
  pool: { total: number; idle: number; waiting: number };
}

/** Replies, matched to their command by id. */
export interface ServerReply {
  id: number;
  error?: string;
  stats?: ServerStats;
  trace?: TracedQuery[];
  asyncCounts?: AsyncCounts;
}

/** The server's first message: where it listens. */
export interface ServerReady {
  ready: true;
  url: string;
}
