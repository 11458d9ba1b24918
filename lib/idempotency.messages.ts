/**
 * Messages used in more than one place: the key and signature checks every transport shares, the
 * boot checks' summary, the operator's answers. A message with one use lives beside it.
 */

import { errorMessage as describeError } from './postgres/pg-errors.js';

/** An error's message, for the messages that quote one. */
export { describeError };

export const duplicateInFlight = (key: string) =>
  `Event ${key} is being processed by another delivery; retry later`;

export const claimFailedLog = (scope: string, key: string, code: string | undefined, error: unknown) =>
  `Claim of ${scope} key ${key} failed (SQLSTATE ${code ?? 'none'}): ${describeError(error)}`;

export const hookFailed = (hook: string, error: unknown) => `${hook} threw: ${describeError(error)}`;

export const handlerDatabaseFailedLog = (
  scope: string,
  key: string,
  code: string | undefined,
  error: unknown,
) =>
  `Handler of ${scope} key ${key} lost the database (SQLSTATE ${code ?? 'none'}): ${describeError(error)}; nothing is marked done, answered as unavailable so the sender retries`;

export const badClaimOption = (where: string, detail: string) => `${where} ${detail}`;

export const missingKeyFunction = (where: string) =>
  `${where} needs a key function, e.g. { key: (event) => event.id }`;

export const unprotectedHandlers = (problems: string[]) =>
  `IdempotencyModule refuses to start: these handlers would run unprotected or answer duplicates wrongly:\n  - ${problems.join('\n  - ')}`;

export const unknownOption = (name: string, suggestion: string | undefined) =>
  `IdempotencyModule has no option ${name}${suggestion ? `; did you mean ${suggestion}?` : ''}`;

export const claimOptionType = (option: string, expected: string) => `${option} must be ${expected}`;

export const headerMissing = (header: string) => `${header} header is missing`;

export const headerEmpty = (header: string) => `${header} header is empty`;

export const headerMalformed = (header: string, expected: string) =>
  `${header} header is malformed: expected ${expected}`;

export const signatureMismatch = (header: string, signed: string, detail?: string) =>
  `${header} does not match ${signed}; was it signed with another secret, or the body changed on the way?${detail ? ` (${detail})` : ''}`;

export const signatureTooOld = (header: string, ageSeconds: number, toleranceSeconds: number) =>
  `${header} is ${ageSeconds} s old, more than the tolerance of ${toleranceSeconds} s: refused as a possible replay`;

export const signatureTooNew = (header: string, aheadSeconds: number, toleranceSeconds: number) =>
  `${header} is ${aheadSeconds} s in the future, more than the tolerance of ${toleranceSeconds} s: check the server's clock`;

export const claimUnsettled = (scope: string, key: string) =>
  `The claim of ${scope} key ${key} found a row that changed under it on every read; retry later`;

export const claimReleased = (scope: string, key: string, attempts: number, leaseWasLive: boolean) =>
  `released ${scope} key ${key} (attempt ${attempts}): ${
    leaseWasLive
      ? 'its lease was still live; if its worker is still running, its completion will be refused (lease_lost) and its side effect may run twice'
      : 'its lease had expired'
  }; the next delivery claims it again (attempt ${attempts + 1})`;

export const claimForgotten = (scope: string, key: string, status: string, attempts: number) =>
  `forgot ${scope} key ${key} (${status} after ${attempts} ${attempts === 1 ? 'attempt' : 'attempts'}); its next delivery runs the handler again (attempt 1)`;

export const claimNotFound = (scope: string, key: string) =>
  `no claim of ${scope} key ${key} (a transaction-mode delivery still running is not visible until it commits)`;

export const handoffNotConfigured = (what: string) =>
  `${what} needs IdempotencyModule's handoff option (handoff: { queues: { name: {} } }) and pg-boss installed`;

export const pgBossFailed = (error: unknown) => `pg-boss: ${describeError(error)}`;
