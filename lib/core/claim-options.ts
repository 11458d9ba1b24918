import { MAX_TIMER_MS } from '../idempotency.constants.js';
import { badClaimOption, claimOptionType } from '../idempotency.messages.js';
import type { IdempotencyClaimOptions } from '../interfaces/index.js';
import { IDEMPOTENCY_MODES } from '../strategies/claim-strategies.js';
import type { ClaimSpec } from './claim-strategy.js';
import { closest } from './closest-name.js';
import { Propagation, PROPAGATIONS } from './propagation.js';

const claimModeUnknown = (modes: readonly string[], got: unknown) =>
  `mode must be one of ${modes.map((name) => `'${name}'`).join(', ')}, got ${String(got)}`;

const claimModeContradicted = (external: boolean, mode: string) =>
  `external: ${external} contradicts mode: '${mode}'; give one of them`;

const claimLeaseOutOfRange = (got: unknown, max: number) =>
  typeof got === 'number' && got > max
    ? `leaseMs must be at most ${max} ms (about 24.8 days, the longest timer Node can set), got ${got}`
    : `leaseMs must be a positive number of milliseconds, got ${String(got)}`;

const externalOnlyOptions = () =>
  `leaseMs and heartbeat belong to external mode; add mode: 'external' or remove them`;

/** The claims table's scope and source columns are varchar(255). */
const MAX_SCOPE_LENGTH = 255;

/**
 * Every option a claim takes; a decorator adds its own (`key`, `signature`, ...). The Record type
 * makes a new claim option that is not listed here a compile error.
 */
const CLAIM_OPTIONS: Record<keyof IdempotencyClaimOptions, true> = {
  scope: true,
  source: true,
  mode: true,
  external: true,
  leaseMs: true,
  heartbeat: true,
  propagation: true,
};

/** An option the decorator does not have, with the nearest it does. */
const unknownClaimOption = (name: string, suggestion: string | undefined) =>
  `has no option ${name}${suggestion ? `; did you mean ${suggestion}?` : ''}`;

/**
 * Checks a handler's claim options and resolves them to the spec its deliveries run with. A
 * mistake is a TypeError naming `where` (the decorator, or the service call), thrown when the
 * decorator is evaluated, so it fails at import rather than at the first event. An option the
 * caller does not take (`extrnal: true` built in a variable, or written in JavaScript) is one:
 * ignored, it would leave the handler in transaction mode; `own` lists the caller's own options.
 */
export function resolveClaimSpec(
  where: string,
  options: IdempotencyClaimOptions,
  defaultScope: string,
  own: readonly string[] = [],
): ClaimSpec {
  const fail = (detail: string) => new TypeError(badClaimOption(where, detail));
  const known = [...Object.keys(CLAIM_OPTIONS), ...own];
  for (const name of Object.keys(options ?? {})) {
    if (!known.includes(name)) throw fail(unknownClaimOption(name, closest(name, known)));
  }
  const scope = options.scope ?? defaultScope;
  if (typeof scope !== 'string' || scope.length === 0)
    throw fail(claimOptionType('scope', 'a non-empty string'));
  const source = options.source ?? scope;
  if (typeof source !== 'string' || source.length === 0)
    throw fail(claimOptionType('source', 'a non-empty string'));
  // Both columns are varchar(255): a longer one would make every claim fail, answered 503 forever.
  for (const [option, value] of [
    ['scope', scope],
    ['source', source],
  ] as const) {
    if ([...value].length > MAX_SCOPE_LENGTH) {
      throw fail(
        claimOptionType(option, `at most ${MAX_SCOPE_LENGTH} characters (got ${[...value].length})`),
      );
    }
  }

  const { external } = options;
  if (external !== undefined && typeof external !== 'boolean')
    throw fail(claimOptionType('external', 'a boolean'));
  const mode = options.mode ?? (external ? 'external' : 'transaction');
  if (!IDEMPOTENCY_MODES.includes(mode)) throw fail(claimModeUnknown(IDEMPOTENCY_MODES, mode));
  if (external !== undefined && external !== (mode === 'external'))
    throw fail(claimModeContradicted(external, mode));

  const { leaseMs, heartbeat } = options;
  // Above the longest timer Node can set, the heartbeat would fire every millisecond, and an
  // interval Postgres cannot add to now() would refuse every claim.
  if (leaseMs !== undefined && !(typeof leaseMs === 'number' && leaseMs > 0 && leaseMs <= MAX_TIMER_MS)) {
    throw fail(claimLeaseOutOfRange(leaseMs, MAX_TIMER_MS));
  }
  if (heartbeat !== undefined && typeof heartbeat !== 'boolean')
    throw fail(claimOptionType('heartbeat', 'a boolean'));
  if (mode !== 'external' && (leaseMs !== undefined || heartbeat)) throw fail(externalOnlyOptions());
  const propagation = options.propagation === undefined ? Propagation.Required : options.propagation;
  if (!PROPAGATIONS.includes(propagation)) {
    const known = PROPAGATIONS.map((value) => `'${value}'`).join(', ');
    throw fail(claimOptionType('propagation', `one of ${known}, got ${String(propagation)}`));
  }
  return { scope, source, mode, leaseMs, heartbeat: heartbeat ?? false, propagation };
}
