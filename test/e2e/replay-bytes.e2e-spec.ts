import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import request from 'supertest';
import {
  REPLAY_BODIES,
  ReplayBytesFixtureController,
  type ReplayRequest,
} from '../fixtures/replay-bytes.fixture.js';
import { WebhookFixtureModule } from '../fixtures/webhook-fixture.module.js';
import { ADAPTERS, startApp, type RunningApp } from '../support/app.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';

/** Headers that differ between any two answers, or that only a replay has. */
const PER_ANSWER = new Set(['date', 'connection', 'keep-alive', 'idempotent-replayed']);

/** An answer as it came off the wire: the body's bytes, and the headers by their names as sent. */
interface RawAnswer {
  status: number;
  bytes: Buffer;
  /** Raw name → value, but for PER_ANSWER's. */
  headers: Record<string, string>;
  replayed: string | undefined;
}

/**
 * A replay answers the bytes first sent, with the same header names (as the handler wrote them)
 * and the same Content-Type, whatever jsonb would do to the JSON (it sorts keys by length, then by
 * bytes). A client that hashes, signs or compares the answer sees the same one. An HTTP answer,
 * so on both platforms; transaction mode (stored by the COMMIT's query) and external mode (by the
 * fenced completion).
 */
describe.each(ADAPTERS)('a replay answers the bytes first sent (%s)', (adapter) => {
  let db: TestDatabase;
  let running: RunningApp;
  let fixture: ReplayBytesFixtureController;

  beforeAll(async () => {
    db = await createTestDatabase();
    running = await startApp(adapter, [
      WebhookFixtureModule.forDatabase({ databaseUrl: db.url, controllers: [ReplayBytesFixtureController] }),
    ]);
    fixture = running.app.get(ReplayBytesFixtureController);
  });

  afterAll(async () => {
    await running?.close();
    await db?.drop();
  });

  const send = async (path: string, key: string, body: ReplayRequest): Promise<RawAnswer> => {
    const answer = await request(running.url)
      .post(path)
      .set('X-User', 'user_a')
      .set('Idempotency-Key', `"${key}"`)
      .send(body)
      .buffer(true)
      .parse((response, done) => {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('end', () => done(null, Buffer.concat(chunks)));
      });
    const raw = (answer as unknown as { res: { rawHeaders: string[] } }).res.rawHeaders;
    const headers: Record<string, string> = {};
    for (let i = 0; i < raw.length; i += 2) {
      if (!PER_ANSWER.has(raw[i].toLowerCase())) headers[raw[i]] = raw[i + 1];
    }
    return {
      status: answer.status,
      bytes: answer.body as Buffer,
      headers,
      replayed: answer.headers['idempotent-replayed'],
    };
  };
  const runsOf = (id: string) => fixture.runs.filter((ran) => ran === id).length;

  /** The body as Nest sends a handler's value: JSON for an object, the text for a string or number. */
  const sent = (value: unknown) => (typeof value === 'object' ? JSON.stringify(value) : String(value));

  const cases = Object.keys(REPLAY_BODIES) as (keyof typeof REPLAY_BODIES)[];
  describe.each([
    ['transaction mode', '/bytes'],
    ['external mode', '/bytes/external'],
  ])('%s', (_mode, path) => {
    it.each(cases)('replays %s byte for byte, with the same headers', async (name) => {
      const id = `${name}_${path.replaceAll('/', '_')}_${adapter}`;
      const first = await send(path, `key-${id}`, { id, body: name });
      expect(first.status).toBe(201);
      expect(first.replayed).toBeUndefined();
      expect(first.bytes.toString('utf8')).toBe(sent(REPLAY_BODIES[name]));

      const replay = await send(path, `key-${id}`, { id, body: name });
      expect(replay.replayed).toBe('true');
      expect(replay.status).toBe(first.status);
      expect(replay.bytes.toString('utf8')).toBe(first.bytes.toString('utf8'));
      expect(replay.bytes.equals(first.bytes)).toBe(true);
      // Names as sent (Express keeps the handler's `Location`, `X-Trace-Id`), values, Content-Type.
      expect(replay.headers).toEqual(first.headers);
      expect(runsOf(id)).toBe(1);
    });

    it('replays a Content-Type the handler set, with the same bytes', async () => {
      const id = `content_type_${path.replaceAll('/', '_')}_${adapter}`;
      const body: ReplayRequest = { id, body: 'order', contentType: 'application/vnd.api+json' };
      const first = await send(path, `key-${id}`, body);
      expect(first.status).toBe(201);
      const contentType = Object.entries(first.headers).find(
        ([name]) => name.toLowerCase() === 'content-type',
      );
      expect(contentType?.[1]).toMatch(/^application\/vnd\.api\+json/);
      expect(first.bytes.toString('utf8')).toBe(JSON.stringify(REPLAY_BODIES.order));

      const replay = await send(path, `key-${id}`, body);
      expect(replay.replayed).toBe('true');
      expect(replay.headers).toEqual(first.headers);
      expect(replay.bytes.equals(first.bytes)).toBe(true);
      expect(runsOf(id)).toBe(1);
    });
  });

  it('replays a response stored in the earlier shape (a jsonb body, lower-case header names)', async () => {
    const id = `old_shape_${adapter}`;
    const key = `key-${id}`;
    // As a release before this one stored it, without a fingerprint (which conflicts with nothing).
    await db.pool.query(
      `INSERT INTO processed_events (scope, event_key, source, status, completed_at, response)
       VALUES ('ReplayBytesFixtureController.transaction', $1, 'http', 'done', now(), $2)`,
      [
        `user_a:${key}`,
        {
          status: 201,
          headers: { location: '/bytes/old', 'x-trace-id': 'trace-old' },
          body: { b: 1, a: [2] },
        },
      ],
    );
    const replay = await send('/bytes', key, { id, body: 'order' });
    expect(replay.status).toBe(201);
    expect(replay.replayed).toBe('true');
    expect(JSON.parse(replay.bytes.toString('utf8'))).toEqual({ b: 1, a: [2] });
    const byName = Object.fromEntries(
      Object.entries(replay.headers).map(([name, v]) => [name.toLowerCase(), v]),
    );
    expect(byName).toMatchObject({ location: '/bytes/old', 'x-trace-id': 'trace-old' });
    expect(runsOf(id)).toBe(0);
  });
});
