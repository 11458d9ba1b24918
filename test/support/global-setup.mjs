// Plain ESM: Jest loads global setup outside its module transform. It uses the compiled helper
// (`npm test` builds first), so the tests and this file start Postgres the same way.
import { startPostgres } from '../../dist/test/support/postgres-server.js';

/** One PostgreSQL server for the whole run; workers read its address from the environment. */
export default async function globalSetup() {
  const server = await startPostgres();
  process.env.TEST_POSTGRES_ADMIN_URL = server.adminUrl;
  globalThis.__POSTGRES__ = server;
}
