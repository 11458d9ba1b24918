import { errorMessage } from '../postgres/pg-errors.js';

/**
 * Runs a delivery's after-commit callbacks in the order they were registered, each awaited; an
 * error is handed to `failed` and never stops the rest (the claim is done: nothing can undo it).
 */
export async function runAfterCommit(
  callbacks: readonly (() => unknown)[],
  failed: (error: unknown) => void,
): Promise<void> {
  for (const callback of callbacks) {
    try {
      await callback();
    } catch (error) {
      failed(error);
    }
  }
}

/** Logged when an after-commit callback throws: the delivery is done all the same. */
export function afterCommitFailed(scope: string, key: string, error: unknown): string {
  return (
    `An afterCommit() callback of ${scope} failed for ${key} once its claim was done; the delivery ` +
    `stays processed: ${errorMessage(error)}`
  );
}
