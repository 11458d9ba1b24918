import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { IDEMPOTENCY_ENTITIES, IDEMPOTENCY_MIGRATIONS, IdempotencyModule } from '../../../lib/index.js';
import { PaymentsController } from './payments.controller.js';

@Module({
  imports: [
    TypeOrmModule.forRoot({
      type: 'postgres',
      url: process.env.DATABASE_URL,
      entities: [...IDEMPOTENCY_ENTITIES],
      migrations: [...IDEMPOTENCY_MIGRATIONS],
      migrationsRun: true,
    }),
    IdempotencyModule.forRoot({}),
  ],
  controllers: [PaymentsController],
})
export class AppModule {}
