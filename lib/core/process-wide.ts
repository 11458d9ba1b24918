/**
 * Bumped whenever the shape of a value kept through processWide() changes, so that two versions
 * of the library in one process never share a value one of them would misread.
 */
const STATE_VERSION = 2;

/**
 * The one value called `name` in this process (in this realm: each Jest test file has its own),
 * created by whichever copy of the library asks first.
 *
 * Why: the package ships an ESM build and a CommonJS build. An app that loads both (its code
 * through one, a dependency of it through the other) gets two copies of every module, and
 * module-level state would split in two: a service reading IdempotencyContext through one copy
 * would not see the delivery that the other copy's interceptor opened, and `active` would say
 * false inside a handler. So state that must exist once per process (the current delivery, what
 * each pg connection has prepared, which HTTP adapters are instrumented) lives on globalThis
 * under a registered symbol, which both copies find. Classes still differ between the copies:
 * mixing one copy's providers with the other's fails at boot, where Nest names the provider it
 * cannot resolve.
 */
export function processWide<T>(name: string, create: () => T): T {
  const slot = Symbol.for(`nest-idempotent-webhooks/state@${STATE_VERSION}/${name}`);
  const slots = globalThis as unknown as Record<symbol, T | undefined>;
  return (slots[slot] ??= create());
}
