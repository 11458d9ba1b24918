import type { MigrationInterface, QueryRunner } from 'typeorm';
import { claimTable } from '../postgres/claim-table.js';
import { addStoredResponseColumnsSql, dropStoredResponseColumnsSql } from '../postgres/schema.sql.js';

/**
 * Adds `fingerprint` and `response` to `processed_events`: the key checks (a key reused for
 * another request or event) and the responses `@IdempotentRequest` routes replay. Nullable, with
 * no default: instant on any table size. Safe to run when the columns exist.
 */
export class AddStoredResponses1765584000000 implements MigrationInterface {
  name = 'AddStoredResponses1765584000000';

  async up(queryRunner: QueryRunner): Promise<void> {
    for (const sql of addStoredResponseColumnsSql(claimTable(undefined))) await queryRunner.query(sql);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    for (const sql of dropStoredResponseColumnsSql(claimTable(undefined))) await queryRunner.query(sql);
  }
}
