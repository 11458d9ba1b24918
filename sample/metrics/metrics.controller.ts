import { Controller, Get, Header } from '@nestjs/common';
import { register } from 'prom-client';

/**
 * `GET /metrics` in Prometheus text format, from prom-client's default registry. The library
 * registers its metrics there by itself when prom-client is installed (`idempotency_claims_total`,
 * the claim and handler duration histograms, the expired-lease and poison-event gauges, the
 * handoff's queue metrics); nothing in the sample wires them up. The dashboard and alert rules the
 * package ships (`observability/`) read them.
 */
@Controller('metrics')
export class MetricsController {
  @Get()
  @Header('Content-Type', register.contentType)
  metrics(): Promise<string> {
    return register.metrics();
  }
}
