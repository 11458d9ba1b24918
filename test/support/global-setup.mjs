// Plain ESM: Jest loads global setup outside its module transform. It uses the compiled helpers
// (`npm test` builds first), so the tests and this file start servers the same way.
import { CLUSTER_TEMPLATE_ENV, createClusterTemplate } from '../../dist/test/support/cluster-template.js';
import { startPostgres } from '../../dist/test/support/postgres-server.js';
import { startRedis } from '../../dist/test/support/redis-server.js';
import { ensureSystemPackages } from '../../dist/test/support/system-packages.js';
import { createTemplateDatabases, TEMPLATE_ENV } from '../../dist/test/support/template-databases.js';

/**
 * Installs redis-server, pgbouncer, prometheus (with promtool) and chromium where they are missing
 * and the machine allows it (or stops with one line naming the command to run), runs initdb once
 * into the cluster template every test server is copied from, then starts one PostgreSQL and one
 * Redis server for the whole run, and migrates the template databases each test file's database
 * is copied from; workers read their addresses and names from the environment.
 */
export default async function globalSetup() {
  await ensureSystemPackages();
  // One initdb for the run: every PostgreSQL server started from here on (the run's own, and those
  // the outage tests start) is a copy of it. Where the embedded binaries cannot initdb (a run on
  // DATABASE_URL without them), there is no template, and the tests that need a server of their
  // own fail with initdb's message, as they did before.
  const cluster = await createClusterTemplate().catch(() => undefined);
  if (cluster) process.env[CLUSTER_TEMPLATE_ENV] = cluster.dataDir;
  globalThis.__CLUSTER_TEMPLATE__ = cluster;
  const [postgres, redis] = await Promise.allSettled([startPostgres(), startRedis()]);
  if (postgres.status === 'rejected' || redis.status === 'rejected') {
    // Jest runs no teardown after a failed setup: stop the one that did start, or it outlives the run.
    await Promise.all([postgres, redis].map((started) => started.value?.stop()));
    await cluster?.remove();
    throw postgres.status === 'rejected' ? postgres.reason : redis.reason;
  }
  let templates;
  try {
    templates = await createTemplateDatabases(postgres.value.adminUrl);
  } catch (error) {
    await Promise.all([postgres.value.stop(), redis.value.stop(), cluster?.remove()]);
    throw error;
  }
  process.env.TEST_POSTGRES_ADMIN_URL = postgres.value.adminUrl;
  process.env[TEMPLATE_ENV.fixtures] = templates.fixtures;
  process.env[TEMPLATE_ENV.bare] = templates.bare;
  globalThis.__TEMPLATES__ = templates;
  process.env.TEST_REDIS_URL = redis.value.url;
  globalThis.__POSTGRES__ = postgres.value;
  globalThis.__REDIS__ = redis.value;
}
