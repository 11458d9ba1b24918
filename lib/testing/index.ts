export { expireLease } from './expire-lease.js';
export { runAsWebhookDelivery, type WebhookDelivery } from './webhook-delivery.js';
