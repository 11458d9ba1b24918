import 'reflect-metadata';
import { describe, expect, it } from '@jest/globals';
import { extractEventOrder, resolveEventOrder, type EventOrderSpec } from '../../lib/core/event-order.js';
import { IDEMPOTENT_WEBHOOK_METADATA } from '../../lib/idempotency.constants.js';
import {
  IdempotentWebhook,
  shopifyWebhookOrder,
  standardWebhookOrder,
  stripeEventOrder,
  type EventOrderOptions,
} from '../../lib/index.js';
import { InvalidEventOrderError } from '../../lib/errors/index.js';
import { isoTimestampVersion } from '../../lib/keys/webhook-orders.js';

/** Applies `@IdempotentWebhook(options)` to a fresh class's `handle` and returns its metadata. */
function decorate(options: Record<string, unknown>): { order?: EventOrderSpec } {
  class Handlers {
    async handle(): Promise<void> {}
  }
  const descriptor = Object.getOwnPropertyDescriptor(Handlers.prototype, 'handle')!;
  (IdempotentWebhook(options as never) as (t: object, k: string, d: PropertyDescriptor) => void)(
    Handlers.prototype,
    'handle',
    descriptor,
  );
  return Reflect.getMetadata(IDEMPOTENT_WEBHOOK_METADATA, descriptor.value);
}

const key = (event: { id: string }) => event.id;
const order = { entity: (event: { o: string }) => event.o, version: (event: { v: unknown }) => event.v };
const SCOPE = 'Handlers.handle';

describe('the order option, checked when the decorator is applied', () => {
  it('resolves to the guard with its defaults: the claim scope, equal versions applied, stale not run', () => {
    const meta = decorate({ key, order });
    expect(meta.order).toEqual({
      scope: SCOPE,
      entity: order.entity,
      version: order.version,
      equalVersions: 'apply',
      runStale: false,
    });
    expect(decorate({ key }).order).toBeUndefined();
  });

  it.each([
    [{ ...order, enity: 1 }, 'order has no option enity; did you mean entity?'],
    [{ ...order, runstale: true }, 'order has no option runstale; did you mean runStale?'],
    [{ ...order, equalVersion: 'apply' }, 'order has no option equalVersion; did you mean equalVersions?'],
    [{ entity: order.entity }, 'order must be an object with entity and version functions'],
    ['event.created', 'order must be an object with entity and version functions'],
    [{ ...order, equalVersions: 'newest' }, "order.equalVersions must be 'apply' or 'stale', got newest"],
    [{ ...order, runStale: 'yes' }, 'order.runStale must be a boolean'],
    [{ ...order, scope: '' }, 'order.scope must be a non-empty string of at most 255 characters'],
  ])('refuses %j with a TypeError naming it', (given, message) => {
    expect(() => decorate({ key, order: given })).toThrow(TypeError);
    expect(() => decorate({ key, order: given })).toThrow(`@IdempotentWebhook ${message}`);
  });

  it('refuses it in external mode, saying why and what to do instead', () => {
    for (const options of [
      { key, external: true, order },
      { key, mode: 'external', order },
    ]) {
      expect(() => decorate(options)).toThrow(TypeError);
      expect(() => decorate(options)).toThrow(
        "@IdempotentWebhook order needs transaction mode: the version check and its advance are part of the claim's transaction, which external mode does not hold",
      );
    }
  });

  it('suggests order for a misspelt option of the decorator itself', () => {
    expect(() => decorate({ key, ordr: order })).toThrow(
      '@IdempotentWebhook has no option ordr; did you mean order?',
    );
  });
});

describe('one delivery’s entity and version', () => {
  const spec = resolveEventOrder(
    '@IdempotentWebhook',
    { entity: (body: { o: unknown }) => body.o, version: (body: { v: unknown }) => body.v },
    { scope: SCOPE, source: SCOPE, mode: 'transaction', propagation: 'required' },
  );
  const read = (o: unknown, v: unknown) => extractEventOrder(SCOPE, 'evt_1', spec, [{ o, v }, {}], 255);
  const refusal = (o: unknown, v: unknown): InvalidEventOrderError => {
    try {
      read(o, v);
    } catch (error) {
      return error as InvalidEventOrderError;
    }
    throw new Error('not refused');
  };

  it.each([
    [1718000000, '1718000000'],
    [1718000000.25, '1718000000.25'],
    [-0, '0'],
    [1e21, '1e+21'],
    [12345678901234567890n, '12345678901234567890'],
    ['1718000000.123456789', '1718000000.123456789'],
    ['-5', '-5'],
    [new Date('2024-05-01T12:00:00.123Z'), '1714564800123'],
  ])('takes the version %p as %s', (version, literal) => {
    expect(read('sub_1', version)).toEqual({ spec, entity: 'sub_1', version: literal });
  });

  it('takes a whole-number entity as its decimal string, and null as "not ordered"', () => {
    expect(read(450789469, 1)?.entity).toBe('450789469');
    expect(read(null, 'anything')).toBeUndefined();
  });

  it.each([
    [undefined, 1, 'Event entity of Handlers.handle is undefined'],
    [1.5, 1, 'Event entity of Handlers.handle is the number 1.5'],
    ['', 1, 'Event entity of Handlers.handle is empty'],
    ['a\u0000b', 1, 'Event entity of Handlers.handle contains a NUL character'],
    ['\ud800', 1, 'Event entity of Handlers.handle contains a lone UTF-16 surrogate'],
    ['x'.repeat(256), 1, 'Event entity of Handlers.handle is 256 characters long (at most 255)'],
    ['sub_1', NaN, 'Event version of Handlers.handle is NaN'],
    ['sub_1', Infinity, 'Event version of Handlers.handle is Infinity'],
    ['sub_1', '1e9', 'Event version of Handlers.handle is the string "1e9"'],
    ['sub_1', '2024-05-01', 'Event version of Handlers.handle is the string "2024-05-01"'],
    ['sub_1', '1'.repeat(101), 'Event version of Handlers.handle is 101 characters long'],
    ['sub_1', new Date('nope'), 'Event version of Handlers.handle is an invalid Date'],
    ['sub_1', null, 'Event version of Handlers.handle is null'],
    ['sub_1', [1], 'Event version of Handlers.handle is an array'],
  ])('refuses entity %p, version %p: 400, naming what is wrong', (entity, version, message) => {
    const error = refusal(entity, version);
    expect(error).toBeInstanceOf(InvalidEventOrderError);
    expect(error.getStatus()).toBe(400);
    expect(error.message).toContain(message);
    expect(error).toMatchObject({ code: 'IDEMPOTENCY_INVALID_ORDER', scope: SCOPE, key: 'evt_1' });
  });

  it('refuses an extractor that throws, quoting its error', () => {
    const throwing = resolveEventOrder(
      '@IdempotentWebhook',
      {
        entity: () => 'x',
        version: () => {
          throw new Error('no created');
        },
      },
      { scope: SCOPE, source: SCOPE, mode: 'transaction', propagation: 'required' },
    );
    expect(() => extractEventOrder(SCOPE, 'evt_1', throwing, [{}, {}], 255)).toThrow(
      'Event version extractor of Handlers.handle threw: no created',
    );
  });
});

describe('ordering presets', () => {
  const call = (options: EventOrderOptions, body: unknown, headers: Record<string, string> = {}) => ({
    entity: options.entity(body, { headers }),
    version: options.version(body, { headers }),
  });

  it("stripeEventOrder: the event's object and the event's own created, not the object's", () => {
    const event = {
      id: 'evt_1',
      type: 'customer.subscription.updated',
      created: 1718000002,
      data: { object: { id: 'sub_1', created: 1717000000 } },
    };
    expect(call(stripeEventOrder(), event)).toEqual({ entity: 'sub_1', version: 1718000002 });
    const only = stripeEventOrder({ types: ['customer.subscription.updated'] });
    expect(only.entity(event, {})).toBe('sub_1');
    expect(only.entity({ ...event, type: 'customer.subscription.trial_will_end' }, {})).toBeNull();
  });

  it('shopifyWebhookOrder: the resource id and X-Shopify-Triggered-At, nanoseconds kept', () => {
    const headers = {
      'x-shopify-triggered-at': '2024-05-01T12:00:00.123456789Z',
      'x-shopify-topic': 'orders/updated',
    };
    expect(call(shopifyWebhookOrder(), { id: 450789469 }, headers)).toEqual({
      entity: 450789469,
      version: '1714564800.123456789',
    });
    expect(
      call(shopifyWebhookOrder({ version: 'updated_at' }), {
        id: 1,
        updated_at: '2024-05-01T08:00:00-04:00',
      }),
    ).toEqual({ entity: 1, version: '1714564800' });
    expect(shopifyWebhookOrder({ topics: ['orders/paid'] }).entity({ id: 1 }, { headers })).toBeNull();
    expect(() => shopifyWebhookOrder().version({ id: 1 }, { headers: {} })).toThrow(
      'X-Shopify-Triggered-At header is missing',
    );
  });

  it('standardWebhookOrder: your entity, the webhook-timestamp header unless you give a version', () => {
    const entity = (body: { data: { id: string } }) => body.data.id;
    const body = { data: { id: 'user_1', updated: 7 } };
    expect(call(standardWebhookOrder(entity), body, { 'webhook-timestamp': '1714564800' })).toEqual({
      entity: 'user_1',
      version: '1714564800',
    });
    const own = standardWebhookOrder(entity, {
      version: (b: { data: { updated: number } }) => b.data.updated,
    });
    expect(call(own, body)).toEqual({ entity: 'user_1', version: 7 });
  });

  it('isoTimestampVersion: seconds since 1970 with the whole fraction, offsets applied; anything else refused', () => {
    expect(isoTimestampVersion('1970-01-01T00:00:01Z')).toBe('1');
    expect(isoTimestampVersion('2024-05-01T14:00:00.5+02:00')).toBe('1714564800.5');
    expect(() => isoTimestampVersion('2024-05-01 12:00', 'updated_at')).toThrow(
      'updated_at is not an ISO 8601 timestamp',
    );
    expect(() => isoTimestampVersion(undefined, 'updated_at')).toThrow(
      'updated_at is not an ISO 8601 timestamp',
    );
    expect(() => isoTimestampVersion('1969-12-31T23:59:59Z')).toThrow('not a date after 1970');
  });

  it('gives versions the guard accepts, so a preset never answers 400 for a well-formed delivery', () => {
    const spec = resolveEventOrder('@IdempotentWebhook', shopifyWebhookOrder(), {
      scope: SCOPE,
      source: SCOPE,
      mode: 'transaction',
      propagation: 'required',
    });
    const headers = { 'x-shopify-triggered-at': '2024-05-01T12:00:00.000000001Z' };
    expect(extractEventOrder(SCOPE, 'k', spec, [{ id: 9 }, { headers }], 255)).toMatchObject({
      entity: '9',
      version: '1714564800.000000001',
    });
  });
});
