import { performance } from 'node:perf_hooks';
import { describe, expect, it } from '@jest/globals';
import { BadGatewayException, ConflictException, ServiceUnavailableException } from '@nestjs/common';
import { EmptyError } from 'rxjs';
import {
  EventInFlightError,
  IdempotencyUnavailableError,
  InvalidIdempotencyKeyError,
} from '../../lib/errors/index.js';
import {
  crashBeforeCommit,
  deliveryOutcome,
  ExactlyOnceError,
  expectCrashRecovery,
  expectOneEffect,
  type SettledDelivery,
} from '../../lib/testing/index.js';

const resolved = (value: unknown): SettledDelivery => ({ resolved: true, value });
const rejected = (error: unknown): SettledDelivery => ({ resolved: false, error });

/**
 * The testing helpers' own logic, apart from any database: how an answer is judged, and that
 * every wait is bounded. The "handlers" here are plain functions a test would call, counting
 * their effect in memory; the e2e spec runs the helpers on real handlers.
 */
describe('testing helpers (logic)', () => {
  describe('deliveryOutcome', () => {
    it.each([
      ['a 200', 'delivered', resolved({ status: 200 })],
      ['a 204 (statusCode, as Fastify inject answers)', 'delivered', resolved({ statusCode: 204 })],
      ['a 409 (in flight)', 'retry', resolved({ status: 409 })],
      ['a 503 (unavailable)', 'retry', resolved({ status: 503 })],
      ['a 429', 'retry', resolved({ status: 429 })],
      ['a 500', 'failed', resolved({ status: 500 })],
      ['a 400', 'failed', resolved({ status: 400 })],
      ['a plain value', 'delivered', resolved({ recorded: 'evt_1' })],
      ['undefined (a replayed RPC message, given a default)', 'delivered', resolved(undefined)],
      ['a status that is not an HTTP one', 'delivered', resolved({ status: 'ok' })],
      [
        'EventInFlightError',
        'retry',
        rejected(new EventInFlightError('in flight', 'Scope.method', 'evt_1', 1)),
      ],
      [
        'IdempotencyUnavailableError',
        'retry',
        rejected(
          new IdempotencyUnavailableError('down', 'Scope.method', 'evt_1', 1, 'ECONNRESET', undefined),
        ),
      ],
      [
        'InvalidIdempotencyKeyError (the same every time)',
        'failed',
        rejected(new InvalidIdempotencyKeyError('bad key', 'Scope.method', undefined)),
      ],
      [
        'an RPC error IDEMPOTENCY_IN_FLIGHT',
        'retry',
        rejected({ status: 'error', code: 'IDEMPOTENCY_IN_FLIGHT' }),
      ],
      [
        'an RPC error IDEMPOTENCY_UNAVAILABLE',
        'retry',
        rejected({ status: 'error', code: 'IDEMPOTENCY_UNAVAILABLE' }),
      ],
      ['another RPC error', 'failed', rejected({ status: 'error', code: 'IDEMPOTENCY_INVALID_KEY' })],
      ['a thrown 409 HttpException', 'retry', rejected(new ConflictException())],
      ['a thrown 503 HttpException', 'retry', rejected(new ServiceUnavailableException())],
      ['a thrown 502 HttpException', 'failed', rejected(new BadGatewayException())],
      ['an axios-style error with a 503 response', 'retry', rejected({ response: { status: 503 } })],
      ['an axios-style error with a 500 response', 'failed', rejected({ response: { status: 500 } })],
      ['a handler error', 'failed', rejected(new Error('boom'))],
    ])('%s is %s', (_, expected, settled) => {
      expect(deliveryOutcome(settled)).toBe(expected);
    });
  });

  describe('expectOneEffect', () => {
    /** A handler deduping by key in memory: one effect per key. */
    const dedupingHandler = () => {
      const done = new Set<string>();
      let effects = 0;
      return {
        deliver: (key: string) => {
          if (!done.has(key)) {
            done.add(key);
            effects++;
          }
          return { status: 200 };
        },
        effect: () => effects,
      };
    };

    it('passes a handler that dedupes, with copies told 409 at first and redelivered until delivered', async () => {
      const handler = dedupingHandler();
      let busy = 3;
      let deliveries = 0;
      await expectOneEffect({
        deliver: async () => {
          deliveries++;
          await Promise.resolve();
          // The first three answers: "another delivery holds it", as a live lease would say.
          if (busy-- > 0) return { status: 409 };
          return handler.deliver('evt_1');
        },
        effect: handler.effect,
      });
      // Five copies, three of them told to retry once, then one more in sequence.
      expect(deliveries).toBe(5 + 3 + 1);
      expect(handler.effect()).toBe(1);
    });

    it('fails a handler that does the work on every delivery, naming the step and the count', async () => {
      let effects = 0;
      const failure = await expectOneEffect({
        deliver: () => ({ status: 200, effect: effects++ }),
        effect: () => effects,
        concurrent: 3,
      }).catch((error: unknown) => error);
      expect(failure).toBeInstanceOf(ExactlyOnceError);
      expect(failure).toMatchObject({ step: '3 concurrent first deliveries', counted: 3 });
    });

    it('fails at once on a delivery that failed, with its answer, without retrying it', async () => {
      let deliveries = 0;
      await expect(
        expectOneEffect({
          deliver: () => {
            deliveries++;
            return { status: 500, body: { message: 'handler failed' } };
          },
          effect: () => 0,
          concurrent: 1,
        }),
      ).rejects.toThrow(
        "expectOneEffect: the first delivery: delivery 1 failed: it was answered 500 { message: 'handler failed' }",
      );
      expect(deliveries).toBe(1);
    });

    it('gives up on a copy still told to retry after maxAttempts deliveries', async () => {
      let deliveries = 0;
      await expect(
        expectOneEffect({
          deliver: () => {
            deliveries++;
            return { status: 409, text: '{"message":"in flight"}' };
          },
          effect: () => 0,
          concurrent: 1,
          maxAttempts: 3,
        }),
      ).rejects.toThrow(
        /^expectOneEffect: the first delivery: still told to retry after 3 deliveries in \d+ ms \(maxAttempts 3, settleWithinMs 15000\); the last was answered 409 \{"message":"in flight"\}$/,
      );
      expect(deliveries).toBe(3);
    });

    it('gives up on a copy told to retry past settleWithinMs, and on a delivery that never answers', async () => {
      const started = performance.now();
      await expect(
        expectOneEffect({
          deliver: () => rejectedInFlight(),
          effect: () => 0,
          concurrent: 1,
          maxAttempts: 1_000,
          settleWithinMs: 300,
        }),
      ).rejects.toThrow(
        /still told to retry after \d+ deliveries in \d+ ms \(maxAttempts 1000, settleWithinMs 300\)/,
      );
      await expect(
        expectOneEffect({
          deliver: () => new Promise(() => undefined),
          effect: () => 0,
          settleWithinMs: 200,
        }),
      ).rejects.toThrow(
        'expectOneEffect: 5 concurrent first deliveries: the delivery did not answer within 200 ms',
      );
      expect(performance.now() - started).toBeLessThan(3_000);
    });

    it('refuses an effect that is not a number, an event delivered before, and bad bounds', async () => {
      await expect(
        expectOneEffect({ deliver: () => undefined, effect: () => '0' as unknown as number }),
      ).rejects.toThrow(
        'expectOneEffect: effect() must resolve a number, got string 0 (pg returns count(*) as text: wrap it in Number())',
      );
      await expect(expectOneEffect({ deliver: () => undefined, effect: () => 1 })).rejects.toMatchObject({
        name: 'ExactlyOnceError',
        step: 'before the first delivery',
        counted: 1,
      });
      await expect(
        expectOneEffect({ deliver: () => undefined, effect: () => 0, concurrent: 0 }),
      ).rejects.toThrow('expectOneEffect: concurrent must be a whole number of at least 1, got 0');
    });

    it('names rxjs EmptyError for what it is: a replayed RPC message without a default', async () => {
      await expect(
        expectOneEffect({ deliver: () => Promise.reject(new EmptyError()), effect: () => 0, concurrent: 1 }),
      ).rejects.toThrow('(an RPC replay answers nothing: give lastValueFrom a defaultValue)');
    });
  });

  describe('expectCrashRecovery and crashBeforeCommit', () => {
    it('refuses external mode without what it needs to end the lease, before delivering', async () => {
      let deliveries = 0;
      await expect(
        expectCrashRecovery({
          deliver: () => deliveries++,
          effect: () => 0,
          external: true,
          scope: 'Charges.handle',
        }),
      ).rejects.toThrow(
        "expectCrashRecovery: external mode needs dataSource, key, to end the crashed worker's lease (expireLease)",
      );
      expect(deliveries).toBe(0);
    });

    it('says when no claimed delivery reached a COMMIT (a plain function has none)', async () => {
      await expect(
        expectCrashRecovery({ deliver: () => ({ status: 200 }), effect: () => 0, key: 'evt_1' }),
      ).rejects.toMatchObject({
        step: 'the crashed delivery',
        message: expect.stringContaining(
          'the crashed delivery never reached its COMMIT (it was answered 200): no claimed delivery of key "evt_1"',
        ),
      });
    });

    it('refuses bad crash filters and counts', () => {
      expect(() => crashBeforeCommit({ times: 0 })).toThrow(
        'crashBeforeCommit: times must be a whole number of at least 1, got 0',
      );
      expect(() => crashBeforeCommit({ key: '' })).toThrow(
        'crashBeforeCommit: key must be a non-empty string when given, got ""',
      );
    });
  });
});

function rejectedInFlight(): Promise<never> {
  return Promise.reject(new EventInFlightError('in flight', 'Scope.method', 'evt_1', 1));
}
