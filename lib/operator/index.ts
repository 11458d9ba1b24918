/**
 * The `nest-idempotent-webhooks/operator` entry: what an operator's tooling imports, beside the
 * module the app already runs. IdempotencyClaims lists, releases and forgets claims by hand (the
 * command-line tool uses it too); HandoffQueues inspects the handoff's queues and retries its dead
 * letters; IdempotencyConsoleModule mounts the browser console over both. Each is provided by
 * IdempotencyModule (the console by its own module); the app injects them from here.
 */
export { IdempotencyClaims } from './idempotency-claims.service.js';
export { HandoffQueues } from '../transports/queue/handoff-queues.service.js';
export { IdempotencyConsoleModule } from '../console/idempotency-console.module.js';
export type { IdempotencyConsoleOptions } from '../console/console-options.js';
export type {
  ClaimListOptions,
  ClaimListStatus,
  ClaimRecord,
  ClaimRefusal,
  ClaimRefusalReason,
  ClaimState,
  DeadLetteredJob,
  ForgetClaimResult,
  QueueStats,
  ReleaseClaimResult,
  RetryDeadLetterResult,
} from '../interfaces/index.js';
