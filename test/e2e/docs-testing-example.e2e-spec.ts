import { afterAll } from '@jest/globals';
import { createEmptyDatabase } from '../support/empty-database.js';

/**
 * The complete example of docs/testing.md, run as a user runs it: its AppModule reads
 * DATABASE_URL when it is imported, so the database is made first and the example imported
 * after (its describe block registers then). test/unit/docs-testing.spec.ts checks that the
 * page shows these very files.
 */
const db = await createEmptyDatabase('docs_testing');
process.env.DATABASE_URL = db.url;
afterAll(() => db.drop());
await import('../examples/testing/exactly-once.example.js');
