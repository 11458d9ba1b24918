import { Controller, Get, Header } from '@nestjs/common';
import { register } from 'prom-client';

/**
 * `GET /metrics` in Prometheus text format, from prom-client's default registry. The library
 * registers `idempotency_claims_total{scope,outcome}` and `idempotency_expired_leases` there by
 * itself when prom-client is installed; nothing in the sample wires them up.
 */
@Controller('metrics')
export class MetricsController {
  @Get()
  @Header('Content-Type', register.contentType)
  metrics(): Promise<string> {
    return register.metrics();
  }
}
