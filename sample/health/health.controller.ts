import { Controller, Get } from '@nestjs/common';
import { HealthCheck, HealthCheckService, TypeOrmHealthIndicator } from '@nestjs/terminus';
import { IdempotencyHealthIndicator } from '../idempotency.js';

/** How long the database may take to answer the health ping. */
const PING_TIMEOUT_MS = 1_500;

/**
 * How long the oldest fulfilment job may wait before the instance reports itself unhealthy: the
 * workers are not keeping up. Its retries wait up to 48 s (app.module.ts), well within this.
 */
const MAX_QUEUE_LAG_MS = 600_000;

/**
 * `GET /health`: 200 when the database answers and the library's claims table and fulfilment
 * queue are healthy, 503 when not. Webhook deliveries depend on it: without the database no event
 * can be claimed, and every delivery is answered 503. Poison events and expired leases are
 * reported (`info.idempotency`) but do not fail the check: they are for a person to look at (the
 * shipped alert rules page one), and taking the instance out of the load balancer fixes neither.
 */
@Controller('health')
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly database: TypeOrmHealthIndicator,
    private readonly idempotency: IdempotencyHealthIndicator,
  ) {}

  @Get()
  @HealthCheck()
  check() {
    return this.health.check([
      // The `timeout` option rather than terminus 12's `.withTimeout()`: terminus 11 (Nest 11) has only the option.
      () => this.database.pingCheck('database', { timeout: PING_TIMEOUT_MS }),
      () => this.idempotency.isHealthy('idempotency', { maxQueueLagMs: MAX_QUEUE_LAG_MS }),
    ]);
  }
}
