/**
 * The handoff's own statements on pg-boss's tables (pg-boss 10's `job` table, partitioned by
 * queue name, with the `job_state` enum ordered created < retry < active < completed < cancelled
 * < failed). Everything else on those tables goes through pg-boss's API.
 */
export interface QueueStatements {
  /** Per queue of $1: jobs by state, and the age of the oldest waiting one (ms). */
  readonly stats: string;
  /** Jobs waiting in the dead-letter queues of $1, oldest first, at most $2. */
  readonly deadLettered: string;
  /**
   * Takes a job waiting in a dead-letter queue out of it, for a retry in the same transaction:
   * its data, or no row when it is not there (retried already). $1 dead-letter queue, $2 job id.
   */
  readonly takeDeadLetter: string;
}

/** The statements for pg-boss's `schema` (checked by the options: a bare identifier). */
export function queueStatements(schema: string): QueueStatements {
  return {
    // One pass over the queues' partitions; `state < 'active'` is pg-boss's own "waiting".
    stats: `
      SELECT name,
             count(*) FILTER (WHERE state = 'created') AS queued,
             count(*) FILTER (WHERE state = 'retry') AS retrying,
             count(*) FILTER (WHERE state = 'active') AS active,
             count(*) FILTER (WHERE state = 'failed') AS failed,
             COALESCE(EXTRACT(epoch FROM now() - min(created_on) FILTER (WHERE state < 'active')) * 1000, 0)
               AS oldest_waiting_ms
      FROM ${schema}.job
      WHERE name = ANY ($1::text[])
      GROUP BY name`,
    // The dead-letter copy keeps the failed job's data and its last output (the error).
    deadLettered: `
      SELECT id, name, data, output, created_on
      FROM ${schema}.job
      WHERE name = ANY ($1::text[]) AND state < 'active'
      ORDER BY created_on, id
      LIMIT $2`,
    // Deleted rather than completed: pg-boss would archive a completed copy, and the retried job
    // is the one that matters. Waiting only: a dead-letter job a worker of its own runs is left.
    takeDeadLetter: `
      DELETE FROM ${schema}.job
      WHERE name = $1 AND id = $2::uuid AND state < 'active'
      RETURNING data`,
  };
}
