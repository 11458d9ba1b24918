/**
 * Claim scopes of the sample's handlers. Named explicitly rather than left to the default
 * `ControllerClass.method`: renaming a class must not make processed events look new. The same
 * event delivered to both endpoints is claimed once in each scope, so each processes it once.
 */
export const STRIPE_SCOPES = {
  orders: 'stripe.orders',
  fulfilment: 'stripe.fulfilment',
} as const;

/** Stored with each claim for reporting. */
export const STRIPE_SOURCE = 'stripe';
