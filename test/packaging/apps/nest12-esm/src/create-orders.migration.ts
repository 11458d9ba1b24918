import type { MigrationInterface, QueryRunner } from 'typeorm';

/** The app's own table, created beside the library's by the same migration run. */
export class CreateOrders1764547300000 implements MigrationInterface {
  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`CREATE TABLE orders (id serial PRIMARY KEY, event_id text NOT NULL UNIQUE)`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE orders`);
  }
}
