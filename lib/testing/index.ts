export { crashBeforeCommit, type CrashOptions } from './crash-before-commit.js';
export { deliveryOutcome, type DeliveryOutcome, type SettledDelivery } from './delivery-outcome.js';
export { ExactlyOnceError } from './exactly-once.error.js';
export { expectCrashRecovery, type CrashRecoveryOptions } from './expect-crash-recovery.js';
export { expectOneEffect, type OneEffectOptions } from './expect-one-effect.js';
export { expireLease } from './expire-lease.js';
export type { EffectCheckOptions } from './settle-delivery.js';
export { runAsWebhookDelivery, type WebhookDelivery } from './webhook-delivery.js';
