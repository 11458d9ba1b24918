import { Column, Entity, PrimaryColumn } from 'typeorm';

/** Where an invoice is in its life; `invoice.paid` moves it from pending to paid, once. */
export type InvoiceStatus = 'pending' | 'paid';

/**
 * An invoice the app's billing code created (the sample never creates them from webhooks). It
 * shows the seed's conditional update: `invoice.paid` only changes a pending invoice, so a
 * repeated or late event changes nothing.
 */
@Entity({ name: 'invoices' })
export class Invoice {
  /** Stripe's invoice id (`in_...`). */
  @PrimaryColumn({ type: 'varchar', length: 255 })
  id!: string;

  @Column({ type: 'varchar', length: 16, default: 'pending' })
  status!: InvoiceStatus;

  @Column({ name: 'amount_due', type: 'integer' })
  amountDue!: number;

  @Column({ type: 'varchar', length: 3 })
  currency!: string;

  @Column({ name: 'paid_at', type: 'timestamptz', nullable: true })
  paidAt!: Date | null;
}
