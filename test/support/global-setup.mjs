// Plain ESM: Jest loads global setup outside its module transform. It uses the compiled helpers
// (`npm test` builds first), so the tests and this file start servers the same way.
import { startPostgres } from '../../dist/test/support/postgres-server.js';
import { startRedis } from '../../dist/test/support/redis-server.js';

/** One PostgreSQL and one Redis server for the whole run; workers read their addresses from the environment. */
export default async function globalSetup() {
  const [postgres, redis] = await Promise.all([startPostgres(), startRedis()]);
  process.env.TEST_POSTGRES_ADMIN_URL = postgres.adminUrl;
  process.env.TEST_REDIS_URL = redis.url;
  globalThis.__POSTGRES__ = postgres;
  globalThis.__REDIS__ = redis;
}
