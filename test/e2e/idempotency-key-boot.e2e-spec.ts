import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Post, Res, Sse, StreamableFile } from '@nestjs/common';
import { MessagePattern } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { Observable, of } from 'rxjs';
import { IdempotentRequest, IdempotentWebhook } from '../../lib/index.js';
import { storedColumnsRequired } from '../../lib/postgres/claim-database.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { bootFailure } from '../support/boot-failure.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { LogCapture } from '../support/log-capture.js';

@Controller('boot')
class StreamingRoutes {
  @Post('file')
  @IdempotentRequest({ owner: false })
  file(): StreamableFile {
    return new StreamableFile(Buffer.from('x'));
  }

  @Sse('events')
  @IdempotentRequest({ owner: false })
  events(): Observable<{ data: string }> {
    return of({ data: 'x' });
  }

  @Post('observable')
  @IdempotentRequest({ owner: false })
  observable(): Observable<number> {
    return of(1);
  }

  @Post('own-response')
  @IdempotentRequest({ owner: false })
  ownResponse(@Res() response: { send(body: unknown): void }) {
    response.send('sent by the handler');
  }
}

@Controller()
class RequestOnMessage {
  @MessagePattern('boot.request')
  @IdempotentRequest({ owner: false })
  onMessage() {
    return 1;
  }
}

@Controller('boot')
class PlainRequestRoute {
  @Post('refunds')
  @IdempotentRequest({ owner: false })
  refund(@Body() body: object) {
    return body;
  }
}

@Controller('boot')
class WebhookOnly {
  @Post('hook')
  @IdempotentWebhook({ key: (event: { id: string }) => event.id })
  hook() {
    return { ok: true };
  }
}

const app = async (url: string, controllers: unknown[]) =>
  (
    await Test.createTestingModule({
      imports: [WebhookFixtureModule.forDatabase({ databaseUrl: url, controllers: controllers as never })],
    }).compile()
  ).createNestApplication({ logger: false });

/**
 * What a request-mode route cannot be fails the boot, naming it: a stream (StreamableFile, an
 * Observable body, SSE), `@Res()` without passthrough, a message handler; and a claims table
 * without the stored-response columns fails it naming the migration, where a webhook-only app
 * starts with a warning and its key checks off.
 */
describe('request mode: boot checks', () => {
  let db: TestDatabase;
  let unmigrated: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
    unmigrated = await createTestDatabase();
    // A table as the release before this one left it.
    await unmigrated.pool.query('ALTER TABLE processed_events DROP COLUMN fingerprint, DROP COLUMN response');
  });

  afterAll(async () => {
    await db?.drop();
    await unmigrated?.drop();
  });

  it('refuses streams, SSE and @Res() without passthrough on request-mode routes, naming each', async () => {
    const error = await bootFailure(await app(db.url, [StreamingRoutes]));
    expect(error.message).toContain('@IdempotentRequest on StreamingRoutes.file: it returns StreamableFile');
    expect(error.message).toContain('@IdempotentRequest on StreamingRoutes.events: it is an @Sse() route');
    expect(error.message).toContain(
      '@IdempotentRequest on StreamingRoutes.observable: it returns Observable',
    );
    expect(error.message).toContain('StreamingRoutes.ownResponse takes @Res() or @Next()');
  });

  it('refuses @IdempotentRequest on a message handler', async () => {
    const error = await bootFailure(await app(db.url, [RequestOnMessage]));
    expect(error.message).toContain('@IdempotentRequest on RequestOnMessage.onMessage: a message handler');
  });

  it('fails the boot of a request-mode route on a table without the columns, naming the migration', async () => {
    const error = await bootFailure(await app(unmigrated.url, [PlainRequestRoute]));
    expect(error.message).toBe(storedColumnsRequired('"processed_events"', ['PlainRequestRoute.refund']));
    expect(error.message).toContain('AddStoredResponses1765584000000');
  });

  it('starts a webhook-only app on a table without the columns, with a warning, and keeps claiming', async () => {
    const logs = new LogCapture();
    const nest = await app(unmigrated.url, [WebhookOnly]);
    nest.useLogger(logs);
    await nest.init();
    try {
      expect(
        logs.find('warn', 'has no fingerprint and response columns', 'AddStoredResponses1765584000000'),
      ).toHaveLength(1);
      await nest.listen(0, '127.0.0.1');
      const url = await nest.getUrl();
      const send = () =>
        fetch(`${url}/boot/hook`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ id: 'evt_unmigrated' }),
        });
      expect((await send()).status).toBe(200);
      expect((await send()).headers.get('idempotent-replayed')).toBe('true');
      expect(
        await unmigrated.count(`SELECT count(*) FROM processed_events WHERE event_key = 'evt_unmigrated'`),
      ).toBe(1);
    } finally {
      await nest.close();
    }
  });
});
