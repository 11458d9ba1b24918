import { Column, Entity, EntitySchema, Index, PrimaryColumn, type EntitySchemaColumnOptions } from 'typeorm';
import { claimTable, type ClaimTable } from '../postgres/claim-table.js';
import { versionTable } from '../postgres/version-table.js';

/** The columns, shared by the decorated class and the schema of a table elsewhere. */
const COLUMNS = {
  scope: { type: 'varchar', length: 255 },
  entity: { type: 'text' },
  version: { type: 'numeric' },
  appliedAt: { name: 'applied_at', type: 'timestamptz', default: () => 'now()' },
} as const satisfies Record<string, EntitySchemaColumnOptions>;

/** The default versions table (`processed_events_versions`) and its constraint and index names. */
const DEFAULT = versionTable(claimTable(undefined));

/**
 * The newest version the ordering guard applied per (scope, entity) (`@IdempotentWebhook({ order })`,
 * docs/ordering.md). Registered with the claims entity by `idempotencyEntities()`, created by
 * `processedEventsMigrations()`; its constraint and index names are the migration's, so `synchronize`
 * and `migration:generate` find nothing to change on a migrated table.
 */
@Entity({ name: DEFAULT.name })
@Index(DEFAULT.retentionIndex, ['appliedAt'])
export class ProcessedEventVersion {
  /** The guard's scope (default: the handler's claim scope). */
  @PrimaryColumn({ ...COLUMNS.scope, primaryKeyConstraintName: DEFAULT.primaryKey })
  scope!: string;

  /** The object the events are about (a Stripe subscription id, say). */
  @PrimaryColumn({ ...COLUMNS.entity, primaryKeyConstraintName: DEFAULT.primaryKey })
  entity!: string;

  /** The newest version applied, as a decimal string (pg returns `numeric` as text: exact). */
  @Column(COLUMNS.version)
  version!: string;

  /** When it was applied: retention removes it `retentionDays` later, with the claim that set it. */
  @Column(COLUMNS.appliedAt)
  appliedAt!: Date;
}

/** The versions entity of a claims table elsewhere (the module's `schema` and `table` options). */
export function processedEventVersionSchema(claims: ClaimTable): EntitySchema<ProcessedEventVersion> {
  const table = versionTable(claims);
  return new EntitySchema<ProcessedEventVersion>({
    name: `ProcessedEventVersion:${table.sql}`,
    tableName: table.name,
    schema: table.schema,
    columns: {
      ...COLUMNS,
      scope: { ...COLUMNS.scope, primary: true, primaryKeyConstraintName: table.primaryKey },
      entity: { ...COLUMNS.entity, primary: true, primaryKeyConstraintName: table.primaryKey },
    },
    indices: [{ name: table.retentionIndex, columns: ['appliedAt'] }],
  });
}
