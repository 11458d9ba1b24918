import type { SqlExecutor } from '../../core/claim-strategy.js';
import type { RetryDeadLetterResult } from '../../interfaces/index.js';
import { pgPoolOf } from '../../postgres/typeorm-internals.js';
import { readHandoffPayload } from './handoff-payload.js';
import type { QueueHandoff } from './queue-handoff.js';

const unknownQueue = (queue: string, known: string[]) =>
  `${queue} is not a queue of the handoff (its queues: ${known.join(', ') || 'none'}); nothing was retried`;

const deadLetterNotFound = (id: string, deadLetter: string) =>
  `No job ${id} waits in ${deadLetter}: it was retried already, or never dead-lettered there; nothing was retried`;

const handoffNotRunning = () =>
  'The handoff has not started (the application is still booting, or stopping); nothing was retried';

/** pg-boss job ids are UUIDs: anything else cannot name one (and would fail the cast). */
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * Moves dead-lettered job `id` back to `queue` as a new job with the same data (the event, the
 * handler's data and its trace context), in one transaction: the dead-letter copy is deleted and
 * the new job written together, so a retry happens once however often it is asked for. The new
 * job gets the queue's retries afresh; its data keeps the job's key (HandoffJob.key), so the
 * worker claims it as the job it was, and a downstream sees the same key as before.
 */
export async function retryDeadLetter(
  handoff: QueueHandoff,
  queue: string,
  id: string,
): Promise<RetryDeadLetterResult> {
  const settings = handoff.queues.get(queue);
  if (!settings) {
    return {
      retried: false,
      reason: 'unknown_queue',
      message: unknownQueue(queue, [...handoff.queues.keys()]),
    };
  }
  const notFound = {
    retried: false,
    reason: 'not_found',
    message: deadLetterNotFound(id, settings.deadLetter),
  } as const;
  if (!UUID.test(id)) return notFound;
  const boss = handoff.pgBoss;
  if (!boss || !handoff.statements) throw new Error(handoffNotRunning());
  const client = await pgPoolOf(handoff.dataSource).connect();
  let failed = false;
  try {
    await client.query('BEGIN');
    const { rows } = await client.query(handoff.statements.takeDeadLetter, [settings.deadLetter, id]);
    if (rows.length === 0) {
      await client.query('ROLLBACK');
      return notFound;
    }
    const data: unknown = rows[0].data;
    // pg-boss writes the job through this transaction's connection, as enqueue() does through the claim's.
    const inTransaction: SqlExecutor = {
      executeSql: (text, values) => (values === undefined ? client.query(text) : client.query(text, values)),
    };
    const jobId = await boss.send(queue, data, { db: inTransaction });
    // pg-boss writes nothing for a queue it does not have (dropped since boot): keep the dead letter.
    if (jobId === null)
      throw new Error(`pg-boss has no queue ${queue}; the dead-lettered job ${id} was kept`);
    await client.query('COMMIT');
    return { retried: true, queue, jobId: String(jobId), event: readHandoffPayload(data)?.event ?? null };
  } catch (error) {
    failed = true;
    await client.query('ROLLBACK').catch(() => undefined);
    throw error;
  } finally {
    // A connection whose transaction failed midway is not handed back for reuse.
    client.release(failed);
  }
}
