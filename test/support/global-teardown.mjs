/**
 * Drops the template databases (on a DATABASE_URL server they would stay), then stops the servers
 * global-setup.mjs started (nothing to stop for DATABASE_URL or REDIS_URL), and removes the
 * cluster template the servers were copied from.
 */
export default async function globalTeardown() {
  await globalThis.__TEMPLATES__?.drop();
  await Promise.all([globalThis.__POSTGRES__?.stop(), globalThis.__REDIS__?.stop()]);
  await globalThis.__CLUSTER_TEMPLATE__?.remove();
}
