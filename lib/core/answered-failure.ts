/**
 * A handler that returned normally with a failure as its answer (over HTTP, a 5xx status it set
 * through `@Res({ passthrough: true })` or `@HttpCode`): the transport says so, and the delivery
 * fails with this error, as if the handler had thrown. Transaction mode rolls the claim and the
 * handler's writes back, external mode marks the attempt failed; nothing is stored, and the retry
 * runs again. The interceptor then answers `value`, the handler's own answer (its status is
 * already on the response), not the error: the caller receives what the handler answered.
 */
export class AnsweredFailure extends Error {
  constructor(
    scope: string,
    /** What the handler answered, e.g. `HTTP 500`. */
    answered: string,
    /** The value the handler returned. */
    readonly value: unknown,
  ) {
    super(answeredFailure(scope, answered));
    this.name = 'AnsweredFailure';
  }
}

/** The failure recorded with the claim (`last_error`). */
const answeredFailure = (scope: string, answered: string) =>
  `${scope} answered ${answered}: a failure, so nothing of it was kept and its retry runs again`;
