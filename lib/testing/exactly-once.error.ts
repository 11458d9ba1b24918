/**
 * Thrown by `expectOneEffect` and `expectCrashRecovery` when a handler broke "one event, one
 * effect". The message says which step broke it, what the effect counted, and the usual cause;
 * `step` and `counted` carry the same for a test that wants to look closer.
 */
export class ExactlyOnceError extends Error {
  override name = 'ExactlyOnceError';

  constructor(
    message: string,
    /** The step that broke it, e.g. `'the second delivery, in sequence'`. */
    readonly step: string,
    /** What `effect()` counted after that step; undefined when a delivery itself went wrong. */
    readonly counted?: number,
  ) {
    super(message);
  }
}
