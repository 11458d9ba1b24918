import {
  Body,
  Controller,
  HttpCode,
  Inject,
  Post,
  ServiceUnavailableException,
  UseInterceptors,
} from '@nestjs/common';
import type pg from 'pg';
import { DataSource, type EntityManager } from 'typeorm';
import { IdempotentWebhook, stripeEventOrder, WebhookTransaction } from '../../lib/index.js';
import type { BenchEvent } from '../load/stripe-event.js';
import { SCOPES, type Variant } from '../variants.js';
import {
  ORDER_INSERT,
  RAW_CLAIM,
  RAW_LEASE_CLAIM,
  RAW_LEASE_DONE,
  RAW_LEASE_STATE,
} from './hand-written.sql.js';
import { PassThroughInterceptor } from './pass-through.interceptor.js';

/** DI token of the pg pool under TypeORM's DataSource: the hand-written variants share it. */
export const BENCH_POOL = Symbol('BENCH_POOL');

const SOURCE = 'stripe';
const RECEIVED = { received: true };
const eventKey = (event: BenchEvent) => event.id;

/** Parameters of ORDER_INSERT: the same business write in every variant. */
function order(event: BenchEvent, variant: Variant): unknown[] {
  const intent = event.data.object;
  return [event.id, variant, event.type, intent.amount, intent.currency, intent.customer];
}

/**
 * One route per variant, in one app, on one pool: the only difference between two routes is how
 * they guard the same insert. The hand-written routes follow the seed article line by line.
 */
@Controller()
export class BenchController {
  constructor(
    @Inject(BENCH_POOL) private readonly pool: pg.Pool,
    private readonly dataSource: DataSource,
  ) {}

  @Post('none')
  @HttpCode(200)
  async none(@Body() event: BenchEvent) {
    await this.pool.query(ORDER_INSERT, order(event, 'none'));
    return RECEIVED;
  }

  @Post('raw-naive')
  @HttpCode(200)
  async rawNaive(@Body() event: BenchEvent) {
    const claimed = await this.pool.query(RAW_CLAIM, [SCOPES['raw-naive'], event.id, SOURCE]);
    if (claimed.rowCount === 0) return RECEIVED;
    await this.pool.query(ORDER_INSERT, order(event, 'raw-naive'));
    return RECEIVED;
  }

  @Post('raw-tx')
  @HttpCode(200)
  rawTx(@Body() event: BenchEvent) {
    return this.inTransaction(event, 'raw-tx');
  }

  @Post('raw-tx-intercepted')
  @HttpCode(200)
  @UseInterceptors(PassThroughInterceptor)
  rawTxIntercepted(@Body() event: BenchEvent) {
    return this.inTransaction(event, 'raw-tx-intercepted');
  }

  @Post('lib-tx')
  @IdempotentWebhook({ key: eventKey, scope: SCOPES['lib-tx'], source: SOURCE })
  async libTx(@Body() event: BenchEvent, @WebhookTransaction() manager: EntityManager) {
    await manager.query(ORDER_INSERT, order(event, 'lib-tx'));
    return RECEIVED;
  }

  /** lib-tx with the ordering guard on: the same handler, the claim sent as the ordered claim. */
  @Post('lib-tx-ordered')
  @IdempotentWebhook({
    key: eventKey,
    scope: SCOPES['lib-tx-ordered'],
    source: SOURCE,
    order: stripeEventOrder(),
  })
  async libTxOrdered(@Body() event: BenchEvent, @WebhookTransaction() manager: EntityManager) {
    await manager.query(ORDER_INSERT, order(event, 'lib-tx-ordered'));
    return RECEIVED;
  }

  @Post('raw-lease')
  @HttpCode(200)
  async rawLease(@Body() event: BenchEvent) {
    const scope = SCOPES['raw-lease'];
    const claimed = await this.pool.query(RAW_LEASE_CLAIM, [scope, event.id, SOURCE]);
    if (claimed.rowCount === 0) {
      const state = await this.pool.query(RAW_LEASE_STATE, [scope, event.id]);
      if (state.rows[0]?.status === 'done') return RECEIVED;
      throw new ServiceUnavailableException('another worker is processing this event');
    }
    await this.pool.query(ORDER_INSERT, order(event, 'raw-lease'));
    await this.pool.query(RAW_LEASE_DONE, [scope, event.id]);
    return RECEIVED;
  }

  @Post('lib-external')
  @IdempotentWebhook({ key: eventKey, scope: SCOPES['lib-external'], source: SOURCE, external: true })
  async libExternal(@Body() event: BenchEvent) {
    // Autocommitted through TypeORM, as the library's external mode leaves a handler to do.
    await this.dataSource.query(ORDER_INSERT, order(event, 'lib-external'));
    return RECEIVED;
  }

  /** Seed fix one by hand: the claim and the insert commit together on one pg client. */
  private async inTransaction(event: BenchEvent, variant: 'raw-tx' | 'raw-tx-intercepted') {
    const client = await this.pool.connect();
    let broken: Error | undefined;
    try {
      await client.query('BEGIN');
      const claimed = await client.query(RAW_CLAIM, [SCOPES[variant], event.id, SOURCE]);
      if (claimed.rowCount === 0) {
        await client.query('ROLLBACK');
        return RECEIVED;
      }
      await client.query(ORDER_INSERT, order(event, variant));
      await client.query('COMMIT');
      return RECEIVED;
    } catch (error) {
      await client.query('ROLLBACK').catch((rollbackError: Error) => (broken = rollbackError));
      throw error;
    } finally {
      client.release(broken);
    }
  }
}
