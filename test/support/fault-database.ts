import { createTestDatabase, type TestDatabase } from './database.js';

/**
 * A test database for the fault suite. Its `orders` table takes more than one row per event
 * (the fixture schema's UNIQUE on event_id is dropped): a handler run twice must show up as two
 * rows the report counts, not as a unique violation answered 500 that hides which effect won.
 */
export async function createFaultDatabase(serverAdminUrl?: string): Promise<TestDatabase> {
  const db = await createTestDatabase(serverAdminUrl);
  await db.pool.query('ALTER TABLE orders DROP CONSTRAINT orders_event_id_key');
  return db;
}
