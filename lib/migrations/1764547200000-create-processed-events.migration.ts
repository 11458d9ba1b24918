import type { MigrationInterface, QueryRunner } from 'typeorm';
import { claimTable } from '../postgres/claim-table.js';
import { createClaimTableSql, dropClaimTableSql } from '../postgres/schema.sql.js';

/**
 * Creates `processed_events` for apps that run migrations instead of `synchronize`. Safe to run
 * on a database that already has the table. Register all of the library's migrations at once:
 * `migrations: [...processedEventsMigrations(), ...yours]`.
 */
export class CreateProcessedEvents1764547200000 implements MigrationInterface {
  name = 'CreateProcessedEvents1764547200000';

  async up(queryRunner: QueryRunner): Promise<void> {
    for (const sql of createClaimTableSql(claimTable(undefined))) await queryRunner.query(sql);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    for (const sql of dropClaimTableSql(claimTable(undefined))) await queryRunner.query(sql);
  }
}
