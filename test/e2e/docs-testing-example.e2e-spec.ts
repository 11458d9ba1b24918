import { afterAll } from '@jest/globals';
import { createEmptyDatabase } from '../support/empty-database.js';

/**
 * The complete examples of docs/testing.md (Express with supertest, Fastify with signed
 * deliveries), run as a user runs them: their modules read DATABASE_URL when they are imported,
 * so the database is made first and the examples imported after (their describe blocks register
 * then). test/unit/docs-testing.spec.ts checks that the page shows these very files.
 */
const db = await createEmptyDatabase('docs_testing');
process.env.DATABASE_URL = db.url;
afterAll(() => db.drop());
await import('../examples/testing/exactly-once.example.js');
await import('../examples/testing/fastify-stripe.example.js');
