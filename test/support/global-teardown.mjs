/** Stops the servers global-setup.mjs started (nothing to stop for DATABASE_URL or REDIS_URL). */
export default async function globalTeardown() {
  await Promise.all([globalThis.__POSTGRES__?.stop(), globalThis.__REDIS__?.stop()]);
}
