import { ConfigurableModuleBuilder } from '@nestjs/common';
import { getDataSourceToken } from '@nestjs/typeorm';
import { IDEMPOTENCY_DATA_SOURCE } from './idempotency.constants.js';
import type { IdempotencyModuleExtras, IdempotencyModuleOptions } from './interfaces/index.js';

/**
 * forRoot/forRootAsync come from ConfigurableModuleBuilder. `dataSource` and `isGlobal` are extras:
 * they shape the module (which DataSource token to inject, where the interceptor can resolve), so
 * they are given beside `useFactory`, never returned from it.
 */
export const {
  ConfigurableModuleClass,
  MODULE_OPTIONS_TOKEN: IDEMPOTENCY_MODULE_OPTIONS,
  OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<IdempotencyModuleOptions>({ moduleName: 'Idempotency' })
  .setClassMethodName('forRoot')
  .setExtras<IdempotencyModuleExtras & { isGlobal?: boolean }>(
    { dataSource: undefined, isGlobal: true },
    (definition, extras) => ({
      ...definition,
      // Global by default: @IdempotentWebhook's interceptor resolves its dependencies in whichever
      // module declares the controller.
      global: extras.isGlobal,
      providers: [
        ...(definition.providers ?? []),
        { provide: IDEMPOTENCY_DATA_SOURCE, useExisting: getDataSourceToken(extras.dataSource) },
      ],
    }),
  )
  .build();
