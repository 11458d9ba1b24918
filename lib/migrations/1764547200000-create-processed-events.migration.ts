import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * Creates `processed_events` for apps that run migrations instead of `synchronize`:
 * `migrations: [CreateProcessedEvents1764547200000, ...yours]`. Safe to run on a database that
 * already has the table.
 */
export class CreateProcessedEvents1764547200000 implements MigrationInterface {
  name = 'CreateProcessedEvents1764547200000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE IF NOT EXISTS processed_events (
        scope            varchar(255) NOT NULL,
        event_key        text         NOT NULL,
        source           varchar(255) NOT NULL,
        status           varchar(16)  NOT NULL,
        attempts         integer      NOT NULL DEFAULT 1,
        lease_token      uuid,
        claimed_at       timestamptz  NOT NULL DEFAULT now(),
        lease_expires_at timestamptz,
        completed_at     timestamptz,
        last_error       text,
        CONSTRAINT processed_events_pkey PRIMARY KEY (scope, event_key),
        CONSTRAINT processed_events_status_check CHECK (status IN ('in_progress', 'done', 'failed'))
      )`);
    // The reporter scans live leases; retention scans old done rows. Both stay small partial indexes.
    await queryRunner.query(
      `CREATE INDEX IF NOT EXISTS processed_events_expiring_idx ON processed_events (lease_expires_at) WHERE status = 'in_progress'`,
    );
    await queryRunner.query(
      `CREATE INDEX IF NOT EXISTS processed_events_retention_idx ON processed_events (completed_at) WHERE status = 'done'`,
    );
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE IF EXISTS processed_events`);
  }
}
