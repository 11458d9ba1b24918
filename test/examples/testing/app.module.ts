import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { idempotencyEntities, IdempotencyModule, processedEventsMigrations } from '../../../lib/index.js';
import { PaymentsController } from './payments.controller.js';

@Module({
  imports: [
    TypeOrmModule.forRoot({
      type: 'postgres',
      url: process.env.DATABASE_URL,
      entities: [...idempotencyEntities()],
      migrations: [...processedEventsMigrations()],
      migrationsRun: true,
    }),
    IdempotencyModule.forRoot({}),
  ],
  controllers: [PaymentsController],
})
export class AppModule {}
