/**
 * The one place the sample imports the library from. It uses only the public entry points,
 * exactly as an application would: the root, and `/observability` for the health indicator. In
 * your app this file is `export * from 'nest-idempotent-webhooks';` and
 * `export * from 'nest-idempotent-webhooks/observability';`.
 */
export * from '../lib/index.js';
export * from '../lib/observability/index.js';
