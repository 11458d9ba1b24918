import { AsyncLocalStorage, createHook, type AsyncHook } from 'node:async_hooks';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';

/** Async resources created for the counted requests, by type (PROMISE, TickObject, ...). */
export type AsyncCounts = Record<string, number>;

/** Marks the requests that arrive while counting, and everything they start, through every await. */
const request = new AsyncLocalStorage<true>();
const counts = new Map<string, number>();
let counting = false;
let hook: AsyncHook | undefined;

/**
 * Runs each request of `server` inside `request`'s context while counting, so that the hook below
 * counts what requests create and nothing else: not the runner's commands over IPC, not the
 * polling of settled stats, not pg-pool's idle timers. Outside a count it calls the listeners as
 * they are: a timed load pays one closure call per request, the same for every variant.
 */
export function countRequestsOf(server: Server): void {
  const listeners = server.listeners('request') as ((req: IncomingMessage, res: ServerResponse) => void)[];
  server.removeAllListeners('request');
  for (const listener of listeners) {
    server.on('request', (req: IncomingMessage, res: ServerResponse) =>
      counting ? request.run(true, () => listener.call(server, req, res)) : listener.call(server, req, res),
    );
  }
}

/**
 * Counts every async resource the counted requests create from now on, promises included: what a
 * delivery costs in promise machinery, microtasks and AsyncLocalStorage propagation, which CPU
 * profiles spread thin and noisy throughput cannot show. Deterministic for a given build: the
 * regression guard throughput is not. In the bench server only, never in the library: a hook with
 * an `init` callback makes every promise pay for it, so it runs only while the runner counts, never
 * during a timed load.
 */
export function startAsyncCount(): void {
  counts.clear();
  hook ??= createHook({
    init(_asyncId, type) {
      if (request.getStore()) counts.set(type, (counts.get(type) ?? 0) + 1);
    },
  });
  counting = true;
  hook.enable();
}

/** Stops counting; what the counted requests created, by type. */
export function stopAsyncCount(): AsyncCounts {
  counting = false;
  hook?.disable();
  // Its hook must not stay on for the timed loads that follow (the library has its own).
  request.disable();
  return Object.fromEntries(counts);
}
