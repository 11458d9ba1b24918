import { Controller, Get } from '@nestjs/common';
import { HealthCheck, HealthCheckService, TypeOrmHealthIndicator } from '@nestjs/terminus';

/** How long the database may take to answer the health ping. */
const PING_TIMEOUT_MS = 1_500;

/**
 * `GET /health`: 200 when the database answers, 503 when it does not. Webhook deliveries depend on
 * it: without the database no event can be claimed, and every delivery is answered 503.
 */
@Controller('health')
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly database: TypeOrmHealthIndicator,
  ) {}

  @Get()
  @HealthCheck()
  check() {
    // The `timeout` option rather than terminus 12's `.withTimeout()`: terminus 11 (Nest 11) has only the option.
    return this.health.check([() => this.database.pingCheck('database', { timeout: PING_TIMEOUT_MS })]);
  }
}
