import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from '@jest/globals';
import { resolveIdempotencyConfig } from '../../lib/idempotency.config.js';
import { IdempotentWorker } from '../../lib/transports/queue/idempotent-worker.decorator.js';
import { HANDOFF_DEFAULTS, resolveHandoffOptions } from '../../lib/transports/queue/handoff-options.js';

const noSuggestion = () => undefined;

describe('handoff options', () => {
  it('fills the defaults, and each queue gets a dead-letter queue of its own', () => {
    const config = resolveHandoffOptions({ queues: { fulfilment: {} } }, noSuggestion);
    expect(config).toMatchObject({ schema: 'pgboss', drainMs: 10_000, pollingIntervalMs: 2_000 });
    expect(config.queues.get('fulfilment')).toEqual({
      retryLimit: HANDOFF_DEFAULTS.retryLimit,
      retryDelaySeconds: 10,
      retryBackoff: true,
      expireInSeconds: 900,
      deadLetter: 'fulfilment.dead-letter',
    });
  });

  it('fails the boot for an unknown key, naming the closest known one', () => {
    expect(() => resolveIdempotencyConfig({ handoff: { queus: {} } as never })).toThrow(
      'IdempotencyModule has no option handoff.queus; did you mean handoff.queues?',
    );
    expect(() => resolveIdempotencyConfig({ handoff: { queues: { a: { retryLimt: 1 } as never } } })).toThrow(
      "handoff.queues['a'].retryLimt; did you mean handoff.queues['a'].retryLimit?",
    );
  });

  it.each([
    [{ schema: 'pg-boss' }, 'handoff.schema must be a Postgres name'],
    [{ schema: 'x; DROP TABLE y' }, 'handoff.schema must be a Postgres name'],
    [{ drainMs: -1 }, 'handoff.drainMs must be a number of ms from 0'],
    [{ pollingIntervalMs: 10 }, 'handoff.pollingIntervalMs must be a number of ms from 50'],
    [{ maintenanceIntervalSeconds: 0.5 }, 'handoff.maintenanceIntervalSeconds must be a whole number'],
    [{ queues: [] }, 'handoff.queues must be an object'],
    [{ queues: { 'a b': {} } }, "handoff.queues['a b'] is not a queue name"],
    [{ queues: { a: { retryLimit: -1 } } }, "handoff.queues['a'].retryLimit must be a whole number from 0"],
    [
      { queues: { a: { retryDelaySeconds: 1.5 } } },
      "handoff.queues['a'].retryDelaySeconds must be a whole number",
    ],
    [{ queues: { a: { retryBackoff: 'yes' } } }, "handoff.queues['a'].retryBackoff must be a boolean"],
    [
      { queues: { a: { expireInSeconds: 86_400 } } },
      "handoff.queues['a'].expireInSeconds must be a whole number from 1 to 86399",
    ],
    [{ queues: { a: { deadLetter: 'a' } } }, "handoff.queues['a'].deadLetter must be another queue's name"],
  ])('refuses %j', (handoff, message) => {
    expect(() => resolveIdempotencyConfig({ handoff: handoff as never })).toThrow(message);
  });

  it('refuses a worker without a queue name or with a bad concurrency, when the decorator is evaluated', () => {
    expect(() => IdempotentWorker('')).toThrow('@IdempotentWorker needs a queue name');
    expect(() => IdempotentWorker('q', { concurrency: 0 })).toThrow(
      '@IdempotentWorker concurrency must be a whole number from 1 to 1000',
    );
    expect(() => IdempotentWorker('q', { leaseMs: 1_000 })).toThrow('@IdempotentWorker');
  });

  it('never imports pg-boss statically: the library loads without the optional peer', () => {
    const files = (dir: string): string[] =>
      readdirSync(dir, { withFileTypes: true }).flatMap((entry) =>
        entry.isDirectory()
          ? files(join(dir, entry.name))
          : entry.name.endsWith('.ts')
            ? [join(dir, entry.name)]
            : [],
      );
    const staticImports = files('lib').filter((file) =>
      /^\s*import\s[^(]*from\s+'pg-boss'/m.test(readFileSync(file, 'utf8')),
    );
    expect(staticImports).toEqual([]);
  });
});
