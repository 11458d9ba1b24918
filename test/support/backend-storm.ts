import pg from 'pg';

/** Options of startBackendStorm. */
export interface BackendStormOptions {
  /** The database the app's sessions are on. */
  databaseUrl: string;
  /** The app's application_name: only its sessions are terminated, never the test's own. */
  applicationName: string;
  /** Pause between rounds, in ms. */
  everyMs: number;
  /** Sessions terminated per round at most, chosen at random among the app's. */
  perRound: number;
  /** Bounds: the storm ends after this many rounds or this long, whichever comes first. */
  maxRounds: number;
  maxMs: number;
}

/** What a storm did. */
export interface StormResult {
  rounds: number;
  /** Sessions pg_terminate_backend() terminated. */
  terminated: number;
}

/** A storm under way. */
export interface BackendStorm {
  /** Ends the storm (at the end of its current round) and resolves with what it did. */
  stop(): Promise<StormResult>;
}

/**
 * pg_terminate_backend() storms on an app's sessions, from a session of the storm's own: every
 * `everyMs`, up to `perRound` of the app's backends (picked by application_name on the app's
 * database) are terminated, whatever they are doing: idle in the pool, inside a claim's
 * transaction, or running a fenced completion.
 */
export async function startBackendStorm(options: BackendStormOptions): Promise<BackendStorm> {
  const client = new pg.Client({ connectionString: options.databaseUrl, application_name: 'fault-storm' });
  await client.connect();
  let stopping = false;
  const result: StormResult = { rounds: 0, terminated: 0 };
  const deadline = Date.now() + options.maxMs;
  const storming = (async () => {
    try {
      while (!stopping && result.rounds < options.maxRounds && Date.now() < deadline) {
        const { rows } = await client.query<{ n: string }>(
          `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS n FROM (
             SELECT pid FROM pg_stat_activity
             WHERE application_name = $1 AND datname = current_database() AND pid <> pg_backend_pid()
             ORDER BY random() LIMIT $2) AS victims`,
          [options.applicationName, options.perRound],
        );
        result.rounds++;
        result.terminated += Number(rows[0].n);
        await new Promise((resolve) => setTimeout(resolve, options.everyMs));
      }
    } finally {
      await client.end();
    }
  })();
  return {
    async stop() {
      stopping = true;
      await storming;
      return result;
    },
  };
}
