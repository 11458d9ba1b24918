import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';

/** One refund asked for through `POST /refunds`. */
@Entity({ name: 'refunds' })
export class Refund {
  @PrimaryGeneratedColumn('identity', { type: 'integer' })
  id!: number;

  /** The caller (the sample's bearer token). */
  @Column({ name: 'user_id', type: 'varchar', length: 255 })
  userId!: string;

  @Column({ name: 'payment_intent_id', type: 'varchar', length: 255 })
  paymentIntentId!: string;

  /** In the currency's smallest unit (cents). */
  @Column({ type: 'integer' })
  amount!: number;
}
