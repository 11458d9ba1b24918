import { Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { HealthController } from './health.controller.js';

/** Liveness of the app and its database, via @nestjs/terminus. */
@Module({
  // Failed checks are logged on one line; the 503 body already says what is down.
  imports: [TerminusModule.forRoot({ errorLogStyle: 'pretty' })],
  controllers: [HealthController],
})
export class HealthModule {}
