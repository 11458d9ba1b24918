import type { MigrationInterface, QueryRunner } from 'typeorm';
import { claimTable, DEFAULT_TABLE, type ClaimTable } from '../postgres/claim-table.js';
import {
  addStoredResponseColumnsSql,
  createClaimTableSql,
  createFailedIndexSql,
  createUnfinishedIndexSql,
  dropClaimTableSql,
  dropFailedIndexSql,
  dropStoredResponseColumnsSql,
  dropUnfinishedIndexSql,
} from '../postgres/schema.sql.js';
import { createVersionTableSql, dropVersionTableSql } from '../postgres/version-schema.sql.js';
import { CreateProcessedEvents1764547200000 } from './1764547200000-create-processed-events.migration.js';
import { AddUnfinishedClaimsIndex1764892800000 } from './1764892800000-add-unfinished-claims-index.migration.js';
import { AddFailedClaimsIndex1765238400000 } from './1765238400000-add-failed-claims-index.migration.js';
import { AddStoredResponses1765584000000 } from './1765584000000-add-stored-responses.migration.js';
import { CreateEventVersions1765670400000 } from './1765670400000-create-event-versions.migration.js';

/** A migration class, as TypeORM's `migrations` option takes it. */
export type MigrationClass = new () => MigrationInterface;

/** Every migration of the default table, in order. A release that changes the table adds one here. */
const DEFAULT_MIGRATIONS: MigrationClass[] = [
  CreateProcessedEvents1764547200000,
  AddUnfinishedClaimsIndex1764892800000,
  AddFailedClaimsIndex1765238400000,
  // Key checks and stored responses (fingerprint, response).
  AddStoredResponses1765584000000,
  // The ordering guard's versions table.
  CreateEventVersions1765670400000,
];

/**
 * The library's migrations, in order: `migrations: [...processedEventsMigrations(), ...yours]`.
 * The one name for them: a claims table of your own (the module's `schema` and `table` options,
 * given here too) gets the same steps named after the table, so TypeORM records them apart, and
 * only a function can make those.
 * @default the default table's (CreateProcessedEvents1764547200000, ...)
 */
export function processedEventsMigrations(
  options: { schema?: string; table?: string } = {},
): MigrationClass[] {
  if (options.schema === undefined && (options.table ?? DEFAULT_TABLE) === DEFAULT_TABLE)
    return [...DEFAULT_MIGRATIONS];
  const table = claimTable(options.schema, options.table);
  const tag = pascal(`${table.schema ?? ''} ${table.name}`);
  return [
    migration(`CreateProcessedEvents${tag}1764547200000`, table, createClaimTableSql, dropClaimTableSql),
    migration(
      `AddUnfinishedClaimsIndex${tag}1764892800000`,
      table,
      createUnfinishedIndexSql,
      dropUnfinishedIndexSql,
    ),
    migration(`AddFailedClaimsIndex${tag}1765238400000`, table, createFailedIndexSql, dropFailedIndexSql),
    migration(
      `AddStoredResponses${tag}1765584000000`,
      table,
      addStoredResponseColumnsSql,
      dropStoredResponseColumnsSql,
    ),
    migration(`CreateEventVersions${tag}1765670400000`, table, createVersionTableSql, dropVersionTableSql),
  ];
}

function migration(
  name: string,
  table: ClaimTable,
  up: (table: ClaimTable) => string[],
  down: (table: ClaimTable) => string[],
): MigrationClass {
  // TypeORM reads the timestamp from the name's last 13 digits and records the name.
  return class implements MigrationInterface {
    name = name;
    async up(queryRunner: QueryRunner): Promise<void> {
      for (const sql of up(table)) await queryRunner.query(sql);
    }
    async down(queryRunner: QueryRunner): Promise<void> {
      for (const sql of down(table)) await queryRunner.query(sql);
    }
  };
}

/** `billing webhook_claims` → `BillingWebhookClaims`. */
function pascal(words: string): string {
  return words
    .split(/[^A-Za-z0-9]+/)
    .filter(Boolean)
    .map((word) => word[0].toUpperCase() + word.slice(1))
    .join('');
}
