import { badClaimOption } from '../idempotency.messages.js';
import type { IdempotencyClaimOptions } from '../interfaces/index.js';
import { IDEMPOTENCY_MODES } from '../strategies/claim-strategies.js';
import type { ClaimSpec } from './claim-strategy.js';

/**
 * Checks a handler's claim options and resolves them to the spec its deliveries run with. A
 * mistake is a TypeError naming `where` (the decorator, or the service call), thrown when the
 * decorator is evaluated, so it fails at import rather than at the first event.
 */
export function resolveClaimSpec(
  where: string,
  options: IdempotencyClaimOptions,
  defaultScope: string,
): ClaimSpec {
  const fail = (detail: string) => new TypeError(badClaimOption(where, detail));
  const scope = options.scope ?? defaultScope;
  if (typeof scope !== 'string' || scope.length === 0) throw fail(`scope must be a non-empty string`);
  const source = options.source ?? scope;
  if (typeof source !== 'string' || source.length === 0) throw fail(`source must be a non-empty string`);

  const { external } = options;
  if (external !== undefined && typeof external !== 'boolean') throw fail('external must be a boolean');
  const mode = options.mode ?? (external ? 'external' : 'transaction');
  if (!IDEMPOTENCY_MODES.includes(mode)) {
    throw fail(
      `mode must be one of ${IDEMPOTENCY_MODES.map((name) => `'${name}'`).join(', ')}, got ${String(mode)}`,
    );
  }
  if (external !== undefined && external !== (mode === 'external')) {
    throw fail(`external: ${external} contradicts mode: '${mode}'; give one of them`);
  }

  const { leaseMs, heartbeat } = options;
  if (leaseMs !== undefined && !(typeof leaseMs === 'number' && leaseMs > 0 && Number.isFinite(leaseMs))) {
    throw fail(`leaseMs must be a positive number of milliseconds, got ${String(leaseMs)}`);
  }
  if (heartbeat !== undefined && typeof heartbeat !== 'boolean') throw fail('heartbeat must be a boolean');
  if (mode !== 'external' && (leaseMs !== undefined || heartbeat)) {
    throw fail(`leaseMs and heartbeat belong to external mode; add mode: 'external' or remove them`);
  }
  return { scope, source, mode, leaseMs, heartbeat: heartbeat ?? false };
}
