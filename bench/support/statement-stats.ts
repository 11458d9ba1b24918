import pg from 'pg';

/** What the database executed for one database since the last reset (pg_stat_statements). */
export interface ExecutedStatements {
  calls: number;
  execMs: number;
  /** Normalised statements, most called first. */
  statements: { query: string; calls: number }[];
}

/**
 * The database's own count of statements, to confirm the count taken inside the bench server.
 * Reads from the maintenance database so its own queries are not counted against the bench's.
 */
export class StatementStats {
  private constructor(
    private readonly client: pg.Client,
    private readonly database: string,
  ) {}

  static async open(adminUrl: string, database: string): Promise<StatementStats> {
    const client = new pg.Client({ connectionString: adminUrl });
    await client.connect();
    return new StatementStats(client, database);
  }

  async reset(): Promise<void> {
    await this.client.query('SELECT pg_stat_statements_reset()');
  }

  async read(): Promise<ExecutedStatements> {
    const { rows } = await this.client.query(
      `SELECT regexp_replace(s.query, '\\s+', ' ', 'g') AS query, s.calls::int AS calls, s.total_exec_time AS ms
       FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
       WHERE d.datname = $1 ORDER BY s.calls DESC`,
      [this.database],
    );
    return {
      calls: rows.reduce((sum, row) => sum + row.calls, 0),
      execMs: rows.reduce((sum, row) => sum + row.ms, 0),
      statements: rows.map((row) => ({ query: row.query.trim().slice(0, 160), calls: row.calls })),
    };
  }

  close(): Promise<void> {
    return this.client.end();
  }
}
