import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { onAdapter, startApp, type RunningApp } from '../support/app.js';
import { LogCapture } from '../support/log-capture.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { waitUntil } from '../support/wait-until.js';
import { parkDelivery } from '../support/parked-delivery.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';

const WARN_AFTER_MS = 50;
/**
 * How old the parked transaction must be before the gate opens. The handler's clock starts after
 * BEGIN and the claim, so the margin over WARN_AFTER_MS covers the claim's round trip.
 */
const PARKED_FOR_MS = WARN_AFTER_MS + 250;

/**
 * A transactional handler that holds its transaction past `slowTransactionWarnMs` gets one
 * warning per handler per minute: it probably belongs in external mode, and a warning per
 * delivery would flood the logs exactly when the database is slow.
 */
describe.each(onAdapter('fastify'))('slow transaction warning (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  const logger = new LogCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({
        databaseUrl: db.url,
        idempotency: { slowTransactionWarnMs: WARN_AFTER_MS },
      }),
    ]);
    running.app.useLogger(logger);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  /** Parks a delivery in its transaction until Postgres reports the transaction old enough. */
  const slowDelivery = async (id: string) => {
    const { answer, gates } = await parkDelivery(running, '/orders', { id });
    const oldEnough = async () => {
      const old = await db.count(
        `SELECT count(*) FROM pg_stat_activity
         WHERE datname = $1 AND state = 'idle in transaction'
           AND clock_timestamp() - xact_start > $2::double precision * interval '1 millisecond'`,
        [db.name, PARKED_FOR_MS],
      );
      return old === 1;
    };
    await waitUntil(oldEnough, `the transaction of ${id} to be ${PARKED_FOR_MS} ms old`);
    gates.open(id);
    return answer;
  };

  const slowWarnings = () =>
    logger
      .find('warn', 'held its transaction')
      .filter((line) => line.context === 'IdempotencyModule')
      .map((line) => line.message);

  it('warns once for two slow deliveries of different events within the minute', async () => {
    expect((await slowDelivery(`evt_slow_1_${adapter}`)).status).toBe(200);
    expect((await slowDelivery(`evt_slow_2_${adapter}`)).status).toBe(200);

    expect(await db.count('SELECT count(*) FROM orders')).toBe(2);
    const warnings = slowWarnings();
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(
      new RegExp(
        `^FixtureController\\.order held its transaction for \\d+ ms \\(more than ${WARN_AFTER_MS} ms\\); ` +
          'if it calls something outside the database, mark it @IdempotentWebhook\\(\\{ external: true \\}\\)$',
      ),
    );
    const heldMs = Number(/for (\d+) ms/.exec(warnings[0])![1]);
    expect(heldMs).toBeGreaterThan(WARN_AFTER_MS);
  });
});
