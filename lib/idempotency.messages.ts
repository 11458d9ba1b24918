/** Error and log message factories, so wording stays consistent and testable. */

export const keyExtractorThrew = (scope: string, error: unknown) =>
  `Idempotency key extractor of ${scope} threw: ${error instanceof Error ? error.message : String(error)}`;

export const keyNotString = (scope: string, value: unknown) =>
  `Idempotency key of ${scope} must be a string, got ${value === null ? 'null' : typeof value}`;

export const keyEmpty = (scope: string) => `Idempotency key of ${scope} is empty`;

export const keyHasNul = (scope: string) =>
  `Idempotency key of ${scope} contains a NUL character, which PostgreSQL text cannot store`;

export const keyNotWellFormed = (scope: string) =>
  `Idempotency key of ${scope} contains a lone UTF-16 surrogate; stored as UTF-8 it would become U+FFFD and collide with other keys`;

export const keyTooLong = (scope: string, length: number, max: number) =>
  `Idempotency key of ${scope} is ${length} characters long; the maximum is ${max}`;

export const duplicateInFlight = (key: string) =>
  `Event ${key} is being processed by another delivery; retry later`;

export const databaseUnavailable = (key: string) =>
  `Could not record event ${key}: the database is unavailable; retry later`;

export const transactionAborted = (key: string) =>
  `Event ${key} was not processed: a statement in its transaction failed, so nothing was committed; retry later`;

export const transactionAbortedLog = (scope: string, key: string) =>
  `Handler of ${scope} returned for key ${key} after a statement in its transaction failed; PostgreSQL rolled the COMMIT back and nothing was written. Let database errors propagate, or recover from them inside a nested manager.transaction()`;

export const claimFailedLog = (scope: string, key: string, code: string | undefined, error: unknown) =>
  `Claim of ${scope} key ${key} failed (SQLSTATE ${code ?? 'none'}): ${error instanceof Error ? error.message : String(error)}`;

export const slowTransaction = (scope: string, ms: number, limit: number) =>
  `${scope} held its transaction for ${ms} ms (more than ${limit} ms); if it calls something outside the database, mark it @IdempotentWebhook({ external: true })`;

export const leaseLost = (scope: string, key: string, mine: number, current: number | undefined) =>
  `Lease lost: ${scope} key ${key} finished attempt ${mine} after its lease was taken over (current attempt ${current ?? 'unknown'}); the side effect may have run twice`;

export const completionFailed = (scope: string, key: string, error: unknown) =>
  `Could not mark ${scope} key ${key} done after its handler succeeded: ${error instanceof Error ? error.message : String(error)}; the lease will expire and be reported`;

export const statementForgotten = (name: string) =>
  `A pooled connection had forgotten the prepared statement ${name} (DEALLOCATE ALL, DISCARD ALL, or a pooler in transaction mode); it was dropped and the statement sent on another. Behind a transaction-mode pooler, set preparedStatements: false`;

export const releaseFailed = (scope: string, key: string, error: unknown) =>
  `Could not mark ${scope} key ${key} failed: ${error instanceof Error ? error.message : String(error)}; it becomes claimable when its lease expires`;

export const expiredLease = (scope: string, key: string, attempts: number, ago: number) =>
  `expired lease: ${scope} key ${key} (attempt ${attempts}) expired ${Math.round(ago / 1000)} s ago; its worker probably died`;

export const moreExpiredLeases = (count: number) => `... and ${count} more expired leases`;

export const poisonEvent = (scope: string, key: string, attempts: number, lastError: string | null) =>
  `poison event: ${scope} key ${key} is not done after ${attempts} attempts${lastError ? ` (last error: ${lastError})` : ''}`;

export const noScheduler = () =>
  'ScheduleModule is not imported: expired leases will not be reported. Import ScheduleModule.forRoot() once in your app, or set reporter: false.';

export const hookFailed = (hook: string, error: unknown) =>
  `${hook} threw: ${error instanceof Error ? error.message : String(error)}`;
