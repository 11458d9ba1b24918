import type { MigrationInterface, QueryRunner } from 'typeorm';
import { claimTable } from '../postgres/claim-table.js';
import { createFailedIndexSql, dropFailedIndexSql } from '../postgres/schema.sql.js';

/**
 * Adds the index of failed claims to `processed_events`, which lets retention delete old failed
 * claims without walking every unfinished one. Safe to run when the index exists (create it
 * CONCURRENTLY by hand on a big table first).
 */
export class AddFailedClaimsIndex1765238400000 implements MigrationInterface {
  name = 'AddFailedClaimsIndex1765238400000';

  async up(queryRunner: QueryRunner): Promise<void> {
    for (const sql of createFailedIndexSql(claimTable(undefined))) await queryRunner.query(sql);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    for (const sql of dropFailedIndexSql(claimTable(undefined))) await queryRunner.query(sql);
  }
}
