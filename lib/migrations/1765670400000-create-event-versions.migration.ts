import type { MigrationInterface, QueryRunner } from 'typeorm';
import { claimTable } from '../postgres/claim-table.js';
import { createVersionTableSql, dropVersionTableSql } from '../postgres/version-schema.sql.js';

/**
 * Creates `processed_events_versions`, where the ordering guard (`@IdempotentWebhook({ order })`)
 * keeps the newest version applied per entity. Safe to run when the table exists. Small and
 * empty at first: nothing to do CONCURRENTLY.
 */
export class CreateEventVersions1765670400000 implements MigrationInterface {
  name = 'CreateEventVersions1765670400000';

  async up(queryRunner: QueryRunner): Promise<void> {
    for (const sql of createVersionTableSql(claimTable(undefined))) await queryRunner.query(sql);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    for (const sql of dropVersionTableSql(claimTable(undefined))) await queryRunner.query(sql);
  }
}
