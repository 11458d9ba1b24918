/**
 * The versions table's DDL, for its migration, built for a claims table (default
 * `processed_events`, so `processed_events_versions`). Constraint and index names are the
 * entity's (ProcessedEventVersion), so `synchronize` and `migration:generate` find nothing to
 * change on a migrated table.
 */
import { quoteIdentifier, type ClaimTable } from './claim-table.js';
import { versionTable } from './version-table.js';

/**
 * Creates the versions table: the newest version applied per (scope, entity), and when it was
 * applied. `version` is `numeric`, which compares any integer or decimal exactly (a Unix time in
 * seconds, one with nanoseconds, an object's own counter). The index on `applied_at` serves
 * retention, which removes the versions last applied more than `retentionDays` ago in batches,
 * as it does claims; small next to the claims table, as it has one row per entity, not per event.
 */
export function createVersionTableSql(claims: ClaimTable): string[] {
  const table = versionTable(claims);
  return [
    ...(table.schema === undefined ? [] : [`CREATE SCHEMA IF NOT EXISTS ${quoteIdentifier(table.schema)}`]),
    `CREATE TABLE IF NOT EXISTS ${table.sql} (
        scope      varchar(255) NOT NULL,
        entity     text         NOT NULL,
        version    numeric      NOT NULL,
        applied_at timestamptz  NOT NULL DEFAULT now(),
        CONSTRAINT ${quoteIdentifier(table.primaryKey)} PRIMARY KEY (scope, entity)
      )`,
    `CREATE INDEX IF NOT EXISTS ${quoteIdentifier(table.retentionIndex)} ON ${table.sql} (applied_at)`,
  ];
}

/** Undoes the versions table's migration. */
export function dropVersionTableSql(claims: ClaimTable): string[] {
  return [`DROP TABLE IF EXISTS ${versionTable(claims).sql}`];
}
