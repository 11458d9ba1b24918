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

/**
 * `promise`, or a rejection naming `what` after `timeoutMs`. The timer is unref'd: a wait nobody
 * awaits any more (the loser of a `Promise.any` over two child processes) must not keep Jest alive after
 * the run ("did not exit one second after the test run has completed").
 */
export function within<T>(promise: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, fail) => {
    timer = setTimeout(
      () => fail(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)),
      timeoutMs,
    );
    timer.unref();
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
