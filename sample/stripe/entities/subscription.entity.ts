import { Column, Entity, PrimaryColumn } from 'typeorm';

/**
 * A Stripe subscription as the newest of its events has it. Each `customer.subscription.*` event
 * carries the whole subscription, so applying one is writing its snapshot; the library's ordering
 * guard makes sure an older snapshot delivered late never overwrites a newer one.
 */
@Entity({ name: 'subscriptions' })
export class Subscription {
  /** Stripe's subscription id (`sub_...`). */
  @PrimaryColumn({ type: 'varchar', length: 255 })
  id!: string;

  /** Stripe's status (`active`, `past_due`, `canceled`, ...), as the applied event has it. */
  @Column({ type: 'varchar', length: 32 })
  status!: string;

  /** The event (`evt_...`) this row was last written from. */
  @Column({ name: 'event_id', type: 'varchar', length: 255 })
  eventId!: string;
}
