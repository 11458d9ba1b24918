import { Column, CreateDateColumn, Entity, PrimaryGeneratedColumn } from 'typeorm';

/**
 * One paid order, made from a `payment_intent.succeeded` event. `stripe_event_id` is UNIQUE: the
 * claim makes a repeat delivery a no-op, and the constraint keeps it one if the claims table is
 * ever lost (seed: "then make the write idempotent anyway").
 */
@Entity({ name: 'orders' })
export class Order {
  @PrimaryGeneratedColumn('identity', { type: 'integer' })
  id!: number;

  /** The Stripe event (`evt_...`) the order was made from. */
  @Column({ name: 'stripe_event_id', type: 'varchar', length: 255, unique: true })
  stripeEventId!: string;

  @Column({ name: 'payment_intent_id', type: 'varchar', length: 255 })
  paymentIntentId!: string;

  /** In the currency's smallest unit (cents), as Stripe sends it. */
  @Column({ type: 'integer' })
  amount!: number;

  /** Lower-case ISO code, as Stripe sends it (`usd`). */
  @Column({ type: 'varchar', length: 3 })
  currency!: string;

  @CreateDateColumn({ name: 'created_at', type: 'timestamptz' })
  createdAt!: Date;
}
