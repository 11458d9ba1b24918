export * from './claim-outcome.interface.js';
export * from './claim-record.interface.js';
export * from './event-order-options.interface.js';
export * from './expired-lease.interface.js';
export * from './handoff.interface.js';
export * from './idempotency-module-options.interface.js';
export * from './idempotent-run-result.interface.js';
export * from './idempotent-webhook-options.interface.js';
