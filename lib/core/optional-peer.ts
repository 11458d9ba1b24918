/** Error codes of a require() that cannot load an ES module synchronously. */
const NEEDS_IMPORT = new Set(['ERR_REQUIRE_ESM', 'ERR_REQUIRE_ASYNC_MODULE']);

/**
 * Loads the optional peer dependency `name` (prom-client, cron, @nestjs/schedule,
 * @nestjs/microservices, stripe) when it is first needed, so apps without it still load the
 * library. Rejects when it is not installed; callers decide what its absence means.
 *
 * The ESM build imports it. The CommonJS build (where `require` exists) requires it first, for
 * two reasons: Jest's default CommonJS runtime, which a `nest new` app on Nest 11 tests with,
 * refuses a real import() ("A dynamic import callback was invoked without
 * --experimental-vm-modules"), and when import() does work there it loads a copy outside Jest's
 * module registry (another prom-client registry than the test's, say). An ES-only peer that
 * require() cannot load (a Node release without require(esm), or a module with top-level await)
 * is imported instead; import() stays a real import() in the CommonJS build (module nodenext).
 */
export async function loadOptionalPeer<T>(name: string): Promise<T> {
  if (typeof require === 'function') {
    try {
      // eslint-disable-next-line @typescript-eslint/no-require-imports -- the CommonJS build's loader, see above
      return require(name) as T;
    } catch (error) {
      if (!NEEDS_IMPORT.has((error as { code?: string }).code ?? '')) throw error;
    }
  }
  return (await import(name)) as T;
}
