/**
 * Polls `condition` until it holds, for tests that wait on a real signal (a row's state, the
 * database clock passing a lease's expiry) instead of sleeping a fixed time. Rejects after
 * `timeoutMs` with `what` in the message, so a hang names what never happened.
 */
export async function waitUntil(
  condition: () => boolean | Promise<boolean>,
  what: string,
  timeoutMs = 15_000,
  everyMs = 50,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}
