import { Module, type DynamicModule } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import type pg from 'pg';
import { DataSource } from 'typeorm';
import { idempotencyEntities, IdempotencyModule } from '../../lib/index.js';
import { BENCH_POOL, BenchController } from './bench.controller.js';

/** How the bench server is configured; the same for every variant. */
export interface BenchServerSettings {
  databaseUrl: string;
  /** pg pool size, shared by every variant. */
  poolSize: number;
  /** The library's `concurrentDuplicateWaitMs`; undefined keeps its default. */
  duplicateWaitMs?: number;
  /** The library's `preparedStatements`; undefined keeps its default ('auto'). */
  preparedStatements?: boolean | 'auto';
}

/** The bench app: TypeORM on one pg pool, the library with its defaults, one route per variant. */
@Module({})
export class BenchModule {
  static forRoot(settings: BenchServerSettings): DynamicModule {
    return {
      module: BenchModule,
      imports: [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: settings.databaseUrl,
          entities: [...idempotencyEntities()],
          extra: { max: settings.poolSize },
          retryAttempts: 0,
        }),
        // The reporter runs once a minute, not per event; off so the statement counts hold only
        // what deliveries send. Everything else (prom-client metrics included) keeps its default.
        IdempotencyModule.forRoot({
          reporter: false,
          concurrentDuplicateWaitMs: settings.duplicateWaitMs,
          ...(settings.preparedStatements !== undefined && {
            preparedStatements: settings.preparedStatements,
          }),
        }),
      ],
      controllers: [BenchController],
      providers: [
        {
          provide: BENCH_POOL,
          inject: [DataSource],
          useFactory: (dataSource: DataSource) =>
            (dataSource.driver as unknown as { master: pg.Pool }).master,
        },
      ],
    };
  }
}
