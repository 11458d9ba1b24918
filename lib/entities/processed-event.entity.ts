import {
  Check,
  Column,
  Entity,
  EntitySchema,
  Index,
  PrimaryColumn,
  type EntitySchemaColumnOptions,
} from 'typeorm';
import { claimTable, DEFAULT_TABLE, type ClaimTable } from '../postgres/claim-table.js';
import type { StoredResponse } from '../core/claim-check.js';
import { claimTableNames } from '../postgres/schema.sql.js';
import { ProcessedEventVersion, processedEventVersionSchema } from './processed-event-version.entity.js';

/** Lifecycle of a claim. Transaction mode commits `done`, or records `failed`; external mode uses all three. */
export type ProcessedEventStatus = 'in_progress' | 'done' | 'failed';

/** The columns, shared by the decorated class and the schema of a table elsewhere. */
const COLUMNS = {
  scope: { type: 'varchar', length: 255 },
  key: { name: 'event_key', type: 'text' },
  source: { type: 'varchar', length: 255 },
  status: { type: 'varchar', length: 16 },
  attempts: { type: 'integer', default: 1 },
  leaseToken: { name: 'lease_token', type: 'uuid', nullable: true },
  claimedAt: { name: 'claimed_at', type: 'timestamptz', default: () => 'now()' },
  leaseExpiresAt: { name: 'lease_expires_at', type: 'timestamptz', nullable: true },
  completedAt: { name: 'completed_at', type: 'timestamptz', nullable: true },
  lastError: { name: 'last_error', type: 'text', nullable: true },
  fingerprint: { type: 'text', nullable: true },
  response: { type: 'jsonb', nullable: true },
} as const satisfies Record<string, EntitySchemaColumnOptions>;

/** The CHECK on status, as the migration writes it. */
const STATUS_CHECK = `status IN ('in_progress', 'done', 'failed')`;

/** The default table's constraint and index names. */
const NAMES = claimTableNames(claimTable(undefined));

/**
 * One claimed event per (scope, key). Register it with TypeORM through `idempotencyEntities()`,
 * and create the table with `processedEventsMigrations()` (or `synchronize` in development).
 * Constraint and index names are the migration's, so `synchronize` and `migration:generate` find
 * nothing to change on a migrated table. A table elsewhere has an entity schema of its own.
 */
@Entity({ name: DEFAULT_TABLE })
@Check(NAMES.statusCheck, STATUS_CHECK)
@Index(NAMES.expiring, ['leaseExpiresAt'], { where: `status = 'in_progress'` })
@Index(NAMES.retention, ['completedAt'], { where: `status = 'done'` })
@Index(NAMES.unfinished, ['attempts'], { where: `status <> 'done'` })
@Index(NAMES.failed, ['claimedAt'], { where: `status = 'failed'` })
export class ProcessedEvent {
  /** Which handler claimed it (default `Class.method`). */
  @PrimaryColumn({ ...COLUMNS.scope, primaryKeyConstraintName: NAMES.primaryKey })
  scope!: string;

  /** The event's identity (Stripe `evt_...`, `X-GitHub-Delivery`). */
  @PrimaryColumn({ ...COLUMNS.key, primaryKeyConstraintName: NAMES.primaryKey })
  key!: string;

  /** Who sent it, for reporting (default: the scope). */
  @Column(COLUMNS.source)
  source!: string;

  @Column(COLUMNS.status)
  status!: ProcessedEventStatus;

  /** How many times the claim was taken (re-claims and recorded failures count up). */
  @Column(COLUMNS.attempts)
  attempts!: number;

  /** Fencing token of the current external-mode lease. */
  @Column(COLUMNS.leaseToken)
  leaseToken!: string | null;

  @Column(COLUMNS.claimedAt)
  claimedAt!: Date;

  @Column(COLUMNS.leaseExpiresAt)
  leaseExpiresAt!: Date | null;

  @Column(COLUMNS.completedAt)
  completedAt!: Date | null;

  /** Short message of the last failure. */
  @Column(COLUMNS.lastError)
  lastError!: string | null;

  /** SHA-256 (hex) of what the delivery carried, for the key checks; null when not checked. */
  @Column(COLUMNS.fingerprint)
  fingerprint!: string | null;

  /** What a request-mode route answered (or a `@MessagePattern` replied), replayed to retries. */
  @Column(COLUMNS.response)
  response!: StoredResponse | null;
}

/** The entities of the default table: the claims and the ordering guard's versions. */
const DEFAULT_ENTITIES = [ProcessedEvent, ProcessedEventVersion];

/**
 * The entities to add to your TypeORM configuration: `entities: [...yours, ...idempotencyEntities()]`,
 * the claims and the ordering guard's versions. The one name for them: a claims table elsewhere
 * (the module's `schema` and `table` options, given here too) needs entity schemas made for it,
 * with the same columns and the constraint and index names its migrations
 * (`processedEventsMigrations()`) create.
 * @default the default table's: ProcessedEvent and ProcessedEventVersion
 */
export function idempotencyEntities(
  options: { schema?: string; table?: string } = {},
): (
  | typeof ProcessedEvent
  | typeof ProcessedEventVersion
  | EntitySchema<ProcessedEvent>
  | EntitySchema<ProcessedEventVersion>
)[] {
  if (options.schema === undefined && (options.table ?? DEFAULT_TABLE) === DEFAULT_TABLE)
    return [...DEFAULT_ENTITIES];
  const table = claimTable(options.schema, options.table);
  return [processedEventSchema(table), processedEventVersionSchema(table)];
}

function processedEventSchema(table: ClaimTable): EntitySchema<ProcessedEvent> {
  const names = claimTableNames(table);
  return new EntitySchema<ProcessedEvent>({
    name: `ProcessedEvent:${table.sql}`,
    tableName: table.name,
    schema: table.schema,
    columns: {
      ...COLUMNS,
      scope: { ...COLUMNS.scope, primary: true, primaryKeyConstraintName: names.primaryKey },
      key: { ...COLUMNS.key, primary: true, primaryKeyConstraintName: names.primaryKey },
    },
    checks: [{ name: names.statusCheck, expression: STATUS_CHECK }],
    indices: [
      { name: names.expiring, columns: ['leaseExpiresAt'], where: `status = 'in_progress'` },
      { name: names.retention, columns: ['completedAt'], where: `status = 'done'` },
      { name: names.unfinished, columns: ['attempts'], where: `status <> 'done'` },
      { name: names.failed, columns: ['claimedAt'], where: `status = 'failed'` },
    ],
  });
}
