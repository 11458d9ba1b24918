/**
 * What `IdempotencyService.run()` resolves with: `processed` with what the callback returned, or
 * `replayed` when the event was already done (the callback did not run). In flight, an
 * unavailable database and a bad key reject (see idempotency.errors.ts).
 */
export type IdempotentRunResult<T> = { status: 'processed'; value: T } | { status: 'replayed' };
