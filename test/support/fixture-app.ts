import type { DynamicModule, Type } from '@nestjs/common';
import { ScheduleModule } from '@nestjs/schedule';
import { TypeOrmModule } from '@nestjs/typeorm';
import type { DataSourceOptions } from 'typeorm';
import { idempotencyEntities, IdempotencyModule, type IdempotencyModuleOptions } from '../../lib/index.js';

/** TypeORM's options of a PostgreSQL DataSource. */
type PostgresConnectionOptions = Extract<DataSourceOptions, { type: 'postgres' }>;

/** What one fixture app is made of, besides the parts every fixture app has. */
export interface FixtureAppSettings {
  /** The fixture's module class, whose `forDatabase` returns this. */
  module: Type;
  databaseUrl: string;
  /** The pg pool's size (`extra.max`). @default pg's own, 10 */
  poolSize?: number;
  /** More pg pool settings (`extra`): `connectionTimeoutMillis`, `application_name`, ... @default {} */
  pool?: Record<string, unknown>;
  /** More DataSource options: `isolationLevel`, `subscribers`, `schema`. @default {} */
  // isolationLevel too: TypeORM 0.3's options type has none (the matrix builds against it), 1.x's has.
  dataSource?: Partial<Omit<PostgresConnectionOptions, 'type' | 'url' | 'entities' | 'extra'>> & {
    isolationLevel?: string;
  };
  /** The DataSource's entities. @default idempotencyEntities() */
  entities?: NonNullable<PostgresConnectionOptions['entities']>;
  /**
   * IdempotencyModule.forRoot's options, over `{ prometheus: false }` (and `reporter: false`
   * without `schedule`). @default {}
   */
  idempotency?: IdempotencyModuleOptions;
  /**
   * Import ScheduleModule, which the expired-lease reporter runs on; without it the reporter is off.
   * @default false
   */
  schedule?: boolean;
  /**
   * Modules imported after the DataSource and before IdempotencyModule (ClsModule, BullModule, ...).
   * @default []
   */
  imports?: NonNullable<DynamicModule['imports']>;
  /** @default [] */
  controllers?: DynamicModule['controllers'];
  /** @default [] */
  providers?: DynamicModule['providers'];
}

/**
 * The app module of an e2e fixture: a real TypeORM DataSource on `databaseUrl` (no retries, so a
 * database that is not there fails the boot at once), the library through its index without a
 * prom-client registry, and the fixture's own controllers and providers. Every fixture's
 * `forDatabase` is this with its parts; one that needs what this cannot say (a named DataSource,
 * forRootAsync) builds its module itself.
 */
export function fixtureApp(settings: FixtureAppSettings): DynamicModule {
  const extra = { ...(settings.poolSize === undefined ? {} : { max: settings.poolSize }), ...settings.pool };
  return {
    module: settings.module,
    imports: [
      TypeOrmModule.forRoot({
        type: 'postgres',
        url: settings.databaseUrl,
        entities: settings.entities ?? [...idempotencyEntities()],
        ...(Object.keys(extra).length > 0 ? { extra } : {}),
        retryAttempts: 0,
        ...settings.dataSource,
      }),
      ...(settings.imports ?? []),
      ...(settings.schedule ? [ScheduleModule.forRoot()] : []),
      IdempotencyModule.forRoot({
        prometheus: false,
        ...(settings.schedule ? {} : { reporter: false }),
        ...settings.idempotency,
      }),
    ],
    controllers: settings.controllers ?? [],
    providers: settings.providers ?? [],
  };
}
