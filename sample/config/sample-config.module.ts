import { Global, Inject, Module, type DynamicModule } from '@nestjs/common';
import type { SampleConfig } from './sample-config.js';

/** DI token of the loaded SampleConfig. */
export const SAMPLE_CONFIG = Symbol('SAMPLE_CONFIG');

/** Injects the loaded SampleConfig: `constructor(@InjectSampleConfig() config: SampleConfig)`. */
export const InjectSampleConfig = () => Inject(SAMPLE_CONFIG);

/**
 * Makes the configuration injectable everywhere, including the `inject` lists of
 * `TypeOrmModule.forRootAsync` and `IdempotencyModule.forRootAsync`. main.ts loads it before Nest
 * starts, because it decides whether an embedded PostgreSQL is needed at all.
 */
@Global()
@Module({})
export class SampleConfigModule {
  static forRoot(config: SampleConfig): DynamicModule {
    return {
      module: SampleConfigModule,
      providers: [{ provide: SAMPLE_CONFIG, useValue: config }],
      exports: [SAMPLE_CONFIG],
    };
  }
}
