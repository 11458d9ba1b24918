/**
 * What a claim does when it is made while another delivery runs (a handler that calls
 * `IdempotencyService.run()` or an `@Idempotent` method), in the manner of nestjs-cls's
 * transactional propagation:
 * - `required` (the default): a transaction-mode claim inside a transaction-mode delivery joins
 *   that delivery's transaction, in a savepoint: its claim and its writes commit with the
 *   enclosing delivery or not at all, and a failure of its own rolls back only what it did.
 *   Outside a delivery, or inside an external-mode one (which holds no transaction), it claims on
 *   its own. An external-mode claim cannot join a transaction (its lease must commit at once, so
 *   that a duplicate sees it): inside a transaction-mode delivery it is refused, naming both
 *   scopes, unless it asks for `requiresNew`.
 * - `requiresNew`: always its own claim, on its own connection, committed on its own. Inside a
 *   transaction-mode delivery that is a second pool connection while the first is held.
 * - `mandatory`: must join an enclosing transaction-mode delivery; refused outside one.
 * - `never`: refused inside any delivery.
 */
export const Propagation = {
  Required: 'required',
  RequiresNew: 'requiresNew',
  Mandatory: 'mandatory',
  Never: 'never',
} as const;

/** One of `Propagation`'s values. @default 'required' */
export type Propagation = (typeof Propagation)[keyof typeof Propagation];

/** The values, for option checks and messages. */
export const PROPAGATIONS: readonly Propagation[] = Object.values(Propagation);
