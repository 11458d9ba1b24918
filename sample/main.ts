/**
 * The Stripe sample: `npm run sample`. Starts (or connects to) PostgreSQL, runs the migrations,
 * and serves the webhook endpoints until SIGTERM or Ctrl-C. See the "Sample" section of README.md.
 */
import 'reflect-metadata';
import { Logger, type NestApplicationOptions } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { AppModule } from './app.module.js';
import { loadSampleConfig, SampleConfigError, type SampleConfig } from './config/sample-config.js';
import { openSampleDatabase } from './database/sample-database.js';
import { GracefulShutdown } from './lifecycle/graceful-shutdown.js';

const logger = new Logger('StripeSample');
// Listening before anything starts: a Ctrl-C during start-up must still stop the embedded database.
const shutdown = new GracefulShutdown().listen();

try {
  const config = loadSampleConfig();
  const database = await openSampleDatabase(config);
  shutdown.manage({ database });
  // Typed wider than Nest 11's options, which lack return503OnClosing (the sample runs on both).
  const options: NestApplicationOptions & { return503OnClosing?: boolean } = {
    // Stripe signs the exact bytes it sent; the signature guard needs them, not re-serialised JSON.
    rawBody: true,
    // While draining, requests arriving on open connections get 503 (Stripe retries those). Nest 12
    // only: Nest 11 ignores it and serves them, and the drain's idle sweep closes each connection
    // as it goes idle.
    return503OnClosing: true,
    // Start-up errors are thrown to the catch below (which stops the database), not process.abort().
    abortOnError: false,
  };
  const app = await NestFactory.create<NestExpressApplication>(
    AppModule.forRoot(config, database.url),
    options,
  );
  // Managed before listen: a port already in use must still close the app and its pool.
  shutdown.manage({ app });
  await app.listen(config.port);
  announce(config);
} catch (error) {
  const failure = error instanceof Error ? error : new Error(String(error));
  logger.error(
    `Start-up failed: ${failure.message}`,
    ...(failure instanceof SampleConfigError ? [] : [failure.stack]),
  );
  await shutdown.stop('start-up failed', 1);
}

function announce(config: SampleConfig): void {
  const base = `http://localhost:${config.port}`;
  logger.log(`Ready on ${base}`);
  logger.log(
    `POST ${base}/webhooks/stripe/orders      payment_intent.succeeded → orders, invoice.paid → invoices`,
  );
  logger.log(
    `POST ${base}/webhooks/stripe/fulfilment  checkout.session.completed → ${config.fulfilmentUrl ?? 'log only (FULFILMENT_URL unset)'}`,
  );
  logger.log(
    `POST ${base}/webhooks/stripe/fulfilment-async  checkout.session.completed → 200 at once, a worker calls ${config.fulfilmentUrl ?? 'nothing (FULFILMENT_URL unset: log only)'}`,
  );
  logger.log(`GET  ${base}/health   GET ${base}/metrics`);
  if (config.usingDevSecret) {
    logger.warn(
      `STRIPE_WEBHOOK_SECRET is not set: using the development secret ${config.webhookSecret}. ` +
        'Try `npm run sample:send`, or `stripe listen --forward-to` with STRIPE_WEBHOOK_SECRET set to its whsec_.',
    );
  }
}
