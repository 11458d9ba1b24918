import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { AddressInfo, Server as NetServer } from 'node:net';
import { Controller, Module, type INestMicroservice } from '@nestjs/common';
import { EventPattern, MessagePattern, Payload, Transport, type ClientProxy } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { TypeOrmModule } from '@nestjs/typeorm';
import { lastValueFrom } from 'rxjs';
import {
  idempotencyEntities,
  IdempotencyContext,
  IdempotencyModule,
  IdempotentWebhook,
} from '../../lib/index.js';
import { ORDERING_SCHEMA, type SnapshotEvent } from '../fixtures/ordering.fixture.js';
import { connectClient } from '../support/microservice-app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';
import { waitUntil } from '../support/wait-until.js';

const order = {
  entity: (data: SnapshotEvent) => data.entity,
  version: (data: SnapshotEvent) => data.version,
};

/** Message and event handlers with an ordering guard, each writing the snapshot in its claim's transaction. */
@Controller()
class OrderedMessagesController {
  constructor(private readonly context: IdempotencyContext) {}

  @MessagePattern('ordering-rpc.apply')
  @IdempotentWebhook({ key: (data: SnapshotEvent) => data.id, order })
  async apply(@Payload() data: SnapshotEvent) {
    await this.write(data);
    return { applied: data.id };
  }

  @EventPattern('ordering-rpc.applied')
  @IdempotentWebhook({ key: (data: SnapshotEvent) => data.id, order })
  async onApplied(@Payload() data: SnapshotEvent) {
    await this.write(data);
  }

  private async write(data: SnapshotEvent) {
    await this.context.manager.query(
      `INSERT INTO snapshots (entity, status, event_id) VALUES ($1, $2, $3)
       ON CONFLICT (entity) DO UPDATE SET status = EXCLUDED.status, event_id = EXCLUDED.event_id`,
      [String(data.entity), data.status, data.id],
    );
  }
}

/**
 * The ordering guard over @nestjs/microservices (TCP): a stale message is answered as a replayed
 * one (nothing, the handler not run) and applies nothing; an event whose version is unusable is
 * logged and acknowledged, as one with an unusable key is, since its redelivery would fail the same
 * way; a message's is refused with the library's error.
 */
describe('ordering guard over microservices (tcp)', () => {
  let db: TestDatabase;
  let app: INestMicroservice;
  let client: ClientProxy;
  const logs = new LogCapture();

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(ORDERING_SCHEMA);
    @Module({
      imports: [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: db.url,
          entities: [...idempotencyEntities()],
          retryAttempts: 0,
        }),
        IdempotencyModule.forRoot({ prometheus: false, reporter: false }),
      ],
      controllers: [OrderedMessagesController],
    })
    class OrderedMessagesModule {}
    const moduleRef = await Test.createTestingModule({ imports: [OrderedMessagesModule] }).compile();
    app = moduleRef.createNestMicroservice({
      transport: Transport.TCP,
      options: { host: '127.0.0.1', port: 0 },
      logger: false,
    });
    app.useLogger(logs);
    await app.listen();
    client = await connectClient('tcp', (app.unwrap<NetServer>().address() as AddressInfo).port);
  });

  afterAll(async () => {
    await client?.close();
    await app?.close();
    await db?.drop();
  });

  const snapshot = async (entity: string) =>
    (await db.pool.query('SELECT status, event_id FROM snapshots WHERE entity = $1', [entity])).rows;
  const claims = (id: string) => db.count('SELECT count(*) FROM processed_events WHERE event_key = $1', [id]);

  it('answers a stale message as a replay and applies nothing', async () => {
    const entity = 'rpc_sub_1';
    const newer = { id: 'evt_rpc_2', entity, version: 2, status: 'newer' };
    const older = { id: 'evt_rpc_1', entity, version: 1, status: 'older' };
    expect(await lastValueFrom(client.send('ordering-rpc.apply', newer))).toEqual({ applied: newer.id });
    // A replayed or stale message answers nothing: the observable completes without a value.
    expect(await lastValueFrom(client.send('ordering-rpc.apply', older), { defaultValue: 'nothing' })).toBe(
      'nothing',
    );
    expect(await snapshot(entity)).toEqual([{ status: 'newer', event_id: newer.id }]);
    expect(await claims(older.id)).toBe(1);
  });

  it('refuses a message with an unusable version with IDEMPOTENCY_INVALID_ORDER, writing nothing', async () => {
    const bad = { id: 'evt_rpc_bad', entity: 'rpc_sub_2', version: 'tomorrow', status: 'x' };
    await expect(lastValueFrom(client.send('ordering-rpc.apply', bad))).rejects.toMatchObject({
      code: 'IDEMPOTENCY_INVALID_ORDER',
      scope: 'OrderedMessagesController.apply',
      key: 'evt_rpc_bad',
    });
    expect(await claims(bad.id)).toBe(0);
  });

  it('acknowledges an event with an unusable version, logging why, writing nothing', async () => {
    const bad = { id: 'evt_rpc_bad_event', entity: 'rpc_sub_3', version: [1], status: 'x' };
    const good = { id: 'evt_rpc_good_event', entity: 'rpc_sub_3', version: 1, status: 'ok' };
    await lastValueFrom(client.emit('ordering-rpc.applied', bad), { defaultValue: undefined });
    await lastValueFrom(client.emit('ordering-rpc.applied', good), { defaultValue: undefined });
    // Events are handled in order on one connection: once the good one is applied, the bad one was answered.
    await waitUntil(async () => (await snapshot('rpc_sub_3')).length === 1, 'the good event to be applied');
    // The library's own line, not an RpcException Nest logs for an event that failed.
    expect(
      logs.find(
        'error',
        'Event version of OrderedMessagesController.onApplied is an array',
        'the event was acknowledged without running its handler',
      ),
    ).toHaveLength(1);
    expect(logs.find('error', 'IDEMPOTENCY_INVALID_ORDER')).toEqual([]);
    expect(await claims(bad.id)).toBe(0);
  });
});
