/**
 * Claim scopes of the sample's handlers. Named explicitly rather than left to the default
 * `ControllerClass.method`: renaming a class must not make processed events look new. The same
 * event delivered to both endpoints is claimed once in each scope, so each processes it once.
 */
export const STRIPE_SCOPES = {
  orders: 'stripe.orders',
  fulfilment: 'stripe.fulfilment',
  /** The async endpoint's claim: the event is acknowledged once its job is committed. */
  fulfilmentAsync: 'stripe.fulfilment-async',
  /** The fulfilment worker's claim, per job (keyed by its key, the event's id): the call to the fulfilment API. */
  fulfilmentWorker: 'stripe.fulfilment-worker',
  /** Subscription snapshots, ordered per subscription by the ordering guard (its versions' scope too). */
  subscriptions: 'stripe.subscriptions',
} as const;

/** The pg-boss queue the async endpoint hands fulfilments to. */
export const FULFILMENT_QUEUE = 'stripe-fulfilment';

/** Stored with each claim for reporting. */
export const STRIPE_SOURCE = 'stripe';
