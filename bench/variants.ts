/**
 * The ways of handling the same webhook, measured side by side, and two references:
 * raw-tx-intercepted is raw-tx behind an interceptor that does nothing, which is what Nest charges
 * any route with an interceptor, the library's included; typeorm-tx is the same fix one as a
 * TypeORM app writes it (`dataSource.transaction()`), where the library's handler also runs its
 * insert through TypeORM.
 */
export const VARIANTS = [
  'none',
  'raw-naive',
  'raw-tx',
  'raw-tx-intercepted',
  'typeorm-tx',
  'lib-tx',
  'lib-tx-ordered',
  'raw-lease',
  'lib-external',
  'lib-request',
  'raw-request',
] as const;

/** One way of handling the webhook; it is also the route the bench server serves it on. */
export type Variant = (typeof VARIANTS)[number];

/** What each variant's handler does, for the tables. */
export const VARIANT_DESCRIPTIONS: Record<Variant, string> = {
  none: 'the order insert only, no dedupe (the floor)',
  'raw-naive': "the seed's snippet: claim autocommitted, then the insert (the hole, for reference)",
  'raw-tx': 'hand-written fix one: BEGIN, claim, insert, COMMIT on a pg client',
  'raw-tx-intercepted':
    'raw-tx behind a Nest interceptor that does nothing (reference: what any interceptor costs)',
  'typeorm-tx':
    'raw-tx-intercepted written with TypeORM: `dataSource.transaction()`, claim and insert through its EntityManager',
  'lib-tx': '`@IdempotentWebhook` transaction mode doing the same insert',
  'lib-tx-ordered':
    'lib-tx with the ordering guard on (`order: stripeEventOrder()`): a new entity per event, so a version insert',
  'raw-lease': 'hand-written fix two: lease upsert, insert, mark done',
  'lib-external': '`@IdempotentWebhook({ external: true })` doing the same insert',
  'lib-request':
    '`@IdempotentRequest` (Idempotency-Key header) doing the same insert, its response stored by the COMMIT',
  'raw-request':
    'hand-written request mode: BEGIN, claim with fingerprint, insert, store the response, COMMIT on a pg client',
};

/** The headline comparisons: the library against the hand-written SQL it replaces. */
export const HEADLINE_PAIRS = [
  { name: 'lib-tx/raw-tx', lib: 'lib-tx', raw: 'raw-tx' },
  { name: 'lib-external/raw-lease', lib: 'lib-external', raw: 'raw-lease' },
] as const satisfies readonly Pair[];

/**
 * The request mode (`@IdempotentRequest`): what storing the response costs against the webhook
 * mode on the same work (goal < 5%, no round trip more), and the library against the same done by
 * hand (goal >= 1.0). Interleaved as the headline pairs, in quick runs too.
 */
export const REQUEST_PAIRS = [
  { name: 'lib-request/lib-tx', lib: 'lib-request', raw: 'lib-tx' },
  { name: 'lib-request/raw-request', lib: 'lib-request', raw: 'raw-request' },
] as const satisfies readonly Pair[];

/**
 * The pairs a `--baseline` run measures on both servers: the headline pairs, and the request mode
 * against its hand-written version, so that a change to the request mode's claim is measured
 * against the commit before it (current lib-request / baseline lib-request) too.
 */
export const BASELINE_PAIRS = [...HEADLINE_PAIRS, REQUEST_PAIRS[1]] as const satisfies readonly Pair[];

/**
 * What the ordering guard costs: the same route's handler with `order` on and off, interleaved
 * like the headline pairs, in quick runs too. Goal: below 10%, and no round trip more.
 */
export const GUARD_PAIRS = [
  { name: 'lib-tx-ordered/lib-tx', lib: 'lib-tx-ordered', raw: 'lib-tx' },
] as const satisfies readonly Pair[];

/**
 * Full runs only: lib-tx's gap split in two, what an interceptor costs on its own and what the
 * library costs beyond it; and the library against fix one written with TypeORM, as its users
 * would write it by hand.
 */
export const REFERENCE_PAIRS = [
  { name: 'raw-tx-intercepted/raw-tx', lib: 'raw-tx-intercepted', raw: 'raw-tx' },
  { name: 'lib-tx/raw-tx-intercepted', lib: 'lib-tx', raw: 'raw-tx-intercepted' },
  { name: 'lib-tx/typeorm-tx', lib: 'lib-tx', raw: 'typeorm-tx' },
] as const satisfies readonly Pair[];

/** Two variants whose throughput is compared, interleaved: `lib` over `raw`. */
export interface Pair {
  name: string;
  lib: Variant;
  raw: Variant;
}

/** Workloads: every key new, or 30% of deliveries repeating a key already answered. */
export const WORKLOADS = ['unique', 'dup30'] as const;
export type Workload = (typeof WORKLOADS)[number];

/** Share of repeated keys in the `dup30` workload. */
export const DUPLICATE_SHARE = 0.3;

/** Claim scope of each variant that claims (the library's is set on its decorators). */
export const SCOPES: Record<Exclude<Variant, 'none'>, string> = {
  'raw-naive': 'bench:raw-naive',
  'raw-tx': 'bench:raw-tx',
  'raw-tx-intercepted': 'bench:raw-tx-intercepted',
  'typeorm-tx': 'bench:typeorm-tx',
  'lib-tx': 'bench:lib-tx',
  'lib-tx-ordered': 'bench:lib-tx-ordered',
  'raw-lease': 'bench:raw-lease',
  'lib-external': 'bench:lib-external',
  'lib-request': 'bench:lib-request',
  'raw-request': 'bench:raw-request',
};
