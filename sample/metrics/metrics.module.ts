import { Module, type OnModuleInit } from '@nestjs/common';
import { collectDefaultMetrics, register } from 'prom-client';
import { MetricsController } from './metrics.controller.js';

/** Prometheus metrics: the library's, plus Node's process metrics. */
@Module({ controllers: [MetricsController] })
export class MetricsModule implements OnModuleInit {
  onModuleInit(): void {
    // Registering the default metrics twice in one registry throws; once per process is enough.
    if (!register.getSingleMetric('process_cpu_user_seconds_total')) collectDefaultMetrics();
  }
}
