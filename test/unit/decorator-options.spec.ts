import 'reflect-metadata';
import { describe, expect, it } from '@jest/globals';
import { Idempotent, IdempotentRequest, IdempotentWebhook, IdempotentWorker } from '../../lib/index.js';

/** Applies a method decorator to a fresh class's `handle`, as TypeScript would. */
function apply(decorator: (target: object, key: string, descriptor: PropertyDescriptor) => void): void {
  class Handlers {
    async handle(): Promise<void> {}
  }
  decorator(Handlers.prototype, 'handle', Object.getOwnPropertyDescriptor(Handlers.prototype, 'handle')!);
}

const key = (event: { id: string }) => event.id;
/** Options as JavaScript, or an object built elsewhere, would pass them: not checked by TypeScript. */
const loose = (options: Record<string, unknown>) => options as never;

describe('decorator options', () => {
  it.each([
    ['@IdempotentWebhook', { key, extrnal: true }, 'extrnal', 'external'],
    ['@IdempotentWebhook', { key, external: true, leaseMS: 1_000 }, 'leaseMS', 'leaseMs'],
    ['@IdempotentWebhook', { key, signatur: 'stripe' }, 'signatur', 'signature'],
    ['@IdempotentWebhook', { key, propagaton: 'never' }, 'propagaton', 'propagation'],
    ['@Idempotent', { key, onreplay: () => 1 }, 'onreplay', 'onReplay'],
    ['@Idempotent', { key, scopes: 'x' }, 'scopes', 'scope'],
  ] as const)('%s refuses %j at decoration, suggesting the option meant', (where, options, wrong, meant) => {
    const decorate = () =>
      where === '@IdempotentWebhook'
        ? apply(IdempotentWebhook(loose(options)) as never)
        : apply(Idempotent(loose(options)) as never);
    expect(decorate).toThrow(TypeError);
    expect(decorate).toThrow(`${where} has no option ${wrong}; did you mean ${meant}?`);
  });

  it.each([
    [{ owner: false, requried: false }, 'requried', 'required'],
    [{ owner: false, replayHeader: ['Location'] }, 'replayHeader', 'replayHeaders'],
    [{ owner: false, fingerprints: false }, 'fingerprints', 'fingerprint'],
    [{ owner: false, strictKeySyntx: true }, 'strictKeySyntx', 'strictKeySyntax'],
    // A typo of owner is named as one, not as a missing owner.
    [{ ownr: () => 'user' }, 'ownr', 'owner'],
  ] as const)(
    '@IdempotentRequest refuses %j at decoration, suggesting the option meant',
    (options, wrong, meant) => {
      expect(() => apply(IdempotentRequest(loose(options)) as never)).toThrow(
        `@IdempotentRequest has no option ${wrong}; did you mean ${meant}?`,
      );
    },
  );

  it('checks the key checks options of both decorators when they are evaluated', () => {
    expect(() => IdempotentWebhook(loose({ key, fingerprint: 'stripes' }))).toThrow(
      "@IdempotentWebhook option fingerprint must be one of 'stripe', 'github', 'shopify', 'standard-webhooks', 'body', a function or false, got 'stripes'",
    );
    expect(() => IdempotentWebhook(loose({ key, onKeyConflict: 'strict' }))).toThrow(
      "@IdempotentWebhook option onKeyConflict must be 'replay' or 'refuse', got strict",
    );
    expect(() => IdempotentRequest(loose({ owner: false, required: 'yes' }))).toThrow(
      '@IdempotentRequest required must be a boolean',
    );
    expect(() => IdempotentRequest(loose({ owner: false, strictKeySyntax: 'yes' }))).toThrow(
      '@IdempotentRequest strictKeySyntax must be a boolean',
    );
    expect(() => IdempotentRequest(loose({ owner: 'user' }))).toThrow(
      '@IdempotentRequest owner must be a function or false',
    );
    expect(() => IdempotentRequest(loose({ owner: false, maxStoredResponseBytes: 0 }))).toThrow(
      '@IdempotentRequest maxStoredResponseBytes must be a positive whole number, got 0',
    );
    expect(() => IdempotentRequest(loose({ owner: false, replayHeaders: ['Loca tion'] }))).toThrow(
      '@IdempotentRequest replayHeaders must be an array of header names',
    );
  });

  it.each([
    ['no options', undefined],
    ['options without owner', { required: true }],
    ['owner: undefined', { owner: undefined }],
  ])(
    '@IdempotentRequest with %s fails at import, naming owner and both ways to give it',
    (_what, options) => {
      const decorate = () => apply(IdempotentRequest(loose(options as never)) as never);
      expect(decorate).toThrow(TypeError);
      expect(decorate).toThrow('@IdempotentRequest on Handlers.handle needs owner');
      expect(decorate).toThrow('owner: (request) => request.user.id');
      expect(decorate).toThrow('owner: false');
    },
  );

  it('@IdempotentRequest takes owner: false, the explicit way to share keys, and an owner function', () => {
    expect(() => apply(IdempotentRequest({ owner: false }) as never)).not.toThrow();
    expect(() =>
      apply(IdempotentRequest({ owner: (request: { user: { id: string } }) => request.user.id }) as never),
    ).not.toThrow();
  });

  it('says only what is wrong when no option is near', () => {
    expect(() => apply(IdempotentWebhook(loose({ key, retries: 3 })) as never)).toThrow(
      '@IdempotentWebhook has no option retries',
    );
    expect(() => apply(IdempotentWebhook(loose({ key, retries: 3 })) as never)).not.toThrow('did you mean');
  });

  it('@IdempotentWorker refuses an unknown option too', () => {
    expect(() => IdempotentWorker('jobs', loose({ concurency: 2 }))).toThrow(
      '@IdempotentWorker has no option concurency; did you mean concurrency?',
    );
  });

  it.each([
    ['@IdempotentWebhook', IdempotentWebhook({ key })],
    ['@IdempotentRequest', IdempotentRequest({ owner: false })],
    ['@IdempotentWorker', IdempotentWorker('jobs')],
  ] as const)(
    '%s on a property (no method; it types as a PropertyDecorator too) throws naming it',
    (where, decorator) => {
      class Handlers {
        declare handle: string;
      }
      expect(() => decorator(Handlers.prototype, 'handle')).toThrow(
        `${where} on Handlers.handle: not a method`,
      );
    },
  );

  it('refuses an onReplay that is not a function', () => {
    expect(() => Idempotent(loose({ key, onReplay: 'replayed' }))).toThrow(
      '@Idempotent onReplay must be a function',
    );
  });

  it('accepts every documented option', () => {
    expect(() =>
      apply(
        IdempotentWebhook({
          key,
          scope: 's',
          source: 'src',
          external: true,
          leaseMs: 1_000,
          heartbeat: true,
          propagation: 'requiresNew',
        }) as never,
      ),
    ).not.toThrow();
    expect(() =>
      apply(Idempotent({ key, onReplay: () => 'replayed', propagation: 'never' }) as never),
    ).not.toThrow();
  });
});

/**
 * Compile-time checks (npm run typecheck compiles this file): `@Idempotent` wants a method that
 * returns a Promise, as nestjs-cls's `@UseCls` does; a synchronous one would silently become
 * asynchronous under the claim.
 */
export class TypedTargets {
  @Idempotent({ key: (id: string) => id })
  async handled(id: string): Promise<string> {
    return id;
  }

  // @ts-expect-error a synchronous method does not compile under @Idempotent
  @Idempotent({ key: (id: string) => id })
  synchronous(id: string): string {
    return id;
  }
}
