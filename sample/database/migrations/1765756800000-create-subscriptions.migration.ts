import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The sample's `subscriptions` table, written by `/webhooks/stripe/subscriptions`. Runs after the
 * library's CreateEventVersions1765670400000, the table its ordering guard keeps versions in.
 */
export class CreateSubscriptions1765756800000 implements MigrationInterface {
  name = 'CreateSubscriptions1765756800000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE IF NOT EXISTS subscriptions (
        id       varchar(255) PRIMARY KEY,
        status   varchar(32)  NOT NULL,
        event_id varchar(255) NOT NULL
      )`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query('DROP TABLE IF EXISTS subscriptions');
  }
}
