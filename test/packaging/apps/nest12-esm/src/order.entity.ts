import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';

/** The handler's effect: one row per processed event. */
@Entity('orders')
export class Order {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ name: 'event_id', unique: true })
  eventId!: string;
}
