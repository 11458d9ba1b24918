import type { MigrationInterface, QueryRunner } from 'typeorm';
import { claimTable } from '../postgres/claim-table.js';
import { createUnfinishedIndexSql, dropUnfinishedIndexSql } from '../postgres/schema.sql.js';

/**
 * Adds the index of unfinished claims to `processed_events`, which keeps the reporter's poison
 * query off the heap. Safe to run when the index exists (create it CONCURRENTLY by hand on a big
 * table first).
 */
export class AddUnfinishedClaimsIndex1764892800000 implements MigrationInterface {
  name = 'AddUnfinishedClaimsIndex1764892800000';

  async up(queryRunner: QueryRunner): Promise<void> {
    for (const sql of createUnfinishedIndexSql(claimTable(undefined))) await queryRunner.query(sql);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    for (const sql of dropUnfinishedIndexSql(claimTable(undefined))) await queryRunner.query(sql);
  }
}
