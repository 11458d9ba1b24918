/**
 * The one place the sample imports the library from. It uses only the public entry point, exactly
 * as an application would; in your app this file is `export * from 'nest-idempotent-webhooks';`.
 */
export * from '../lib/index.js';
