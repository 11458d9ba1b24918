/** Stops the server global-setup.mjs started (nothing to stop when DATABASE_URL was given). */
export default async function globalTeardown() {
  await globalThis.__POSTGRES__?.stop();
}
