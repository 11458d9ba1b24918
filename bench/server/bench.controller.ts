import { createHash } from 'node:crypto';
import {
  Body,
  Controller,
  HttpCode,
  Inject,
  Post,
  Req,
  Res,
  ServiceUnavailableException,
  UnprocessableEntityException,
  UseInterceptors,
} from '@nestjs/common';
import type pg from 'pg';
import { DataSource, type EntityManager } from 'typeorm';
import {
  IdempotentRequest,
  IdempotentWebhook,
  stripeEventOrder,
  WebhookTransaction,
} from '../../lib/index.js';
import type { BenchEvent } from '../load/stripe-event.js';
import { SCOPES, type Variant } from '../variants.js';
import {
  ORDER_INSERT,
  RAW_CLAIM,
  RAW_LEASE_CLAIM,
  RAW_LEASE_DONE,
  RAW_LEASE_STATE,
  RAW_REQUEST_CLAIM,
  RAW_REQUEST_STORE,
  RAW_REQUEST_STORED,
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

  /**
   * Seed fix one as a TypeORM app writes it: `dataSource.transaction()`, the claim and the insert
   * through its EntityManager, behind the same no-op interceptor. What the library's handler pays
   * for its own insert through TypeORM, a hand-written TypeORM handler pays too.
   */
  @Post('typeorm-tx')
  @HttpCode(200)
  @UseInterceptors(PassThroughInterceptor)
  typeormTx(@Body() event: BenchEvent) {
    return this.dataSource.transaction(async (manager) => {
      const claimed: unknown[] = await manager.query(RAW_CLAIM, [SCOPES['typeorm-tx'], event.id, SOURCE]);
      if (claimed.length === 0) return RECEIVED; // nothing written: the COMMIT ends an empty transaction
      await manager.query(ORDER_INSERT, order(event, 'typeorm-tx'));
      return RECEIVED;
    });
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

  @Post('lib-request')
  @HttpCode(200)
  // The bench's load has no callers to tell apart (nor has the route by hand it is measured against).
  @IdempotentRequest({ scope: SCOPES['lib-request'], source: SOURCE, owner: false })
  async libRequest(@Body() event: BenchEvent, @WebhookTransaction() manager: EntityManager) {
    await manager.query(ORDER_INSERT, order(event, 'lib-request'));
    return RECEIVED;
  }

  /**
   * The request mode by hand, as careful code would write it: the key from the header, a
   * fingerprint of method, URL and body stored with the claim, the response stored before the
   * COMMIT, and a retry answered the stored response (or 422 for another body).
   */
  @Post('raw-request')
  async rawRequest(
    @Body() event: BenchEvent,
    @Req() request: { method: string; originalUrl?: string; url: string; headers: Record<string, unknown> },
    @Res({ passthrough: true }) response: { status(code: number): unknown },
  ) {
    const key = JSON.parse(String(request.headers['idempotency-key'])) as string;
    const fingerprint = createHash('sha256')
      .update(`${request.method}\n${request.originalUrl ?? request.url}\n${JSON.stringify(event)}`)
      .digest('hex');
    const scope = SCOPES['raw-request'];
    const client = await this.pool.connect();
    let broken: Error | undefined;
    try {
      await client.query('BEGIN');
      const claimed = await client.query(RAW_REQUEST_CLAIM, [scope, key, SOURCE, fingerprint]);
      if (claimed.rowCount === 0) {
        const [stored] = (await client.query(RAW_REQUEST_STORED, [scope, key])).rows;
        await client.query('ROLLBACK');
        if (stored?.fingerprint !== fingerprint) throw new UnprocessableEntityException('key reused');
        response.status(stored.response.status);
        return stored.response.body;
      }
      await client.query(ORDER_INSERT, order(event, 'raw-request'));
      await client.query(RAW_REQUEST_STORE, [scope, key, { status: 200, headers: {}, body: RECEIVED }]);
      await client.query('COMMIT');
      response.status(200);
      return RECEIVED;
    } catch (error) {
      await client.query('ROLLBACK').catch((rollbackError: Error) => (broken = rollbackError));
      throw error;
    } finally {
      client.release(broken);
    }
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
