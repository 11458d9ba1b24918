import type { Logger } from '@nestjs/common';
import type { DataSource, EntitySubscriberInterface, QueryRunner } from 'typeorm';
import { ClaimDelivery } from '../core/claim-delivery.js';
import { currentDelivery } from '../core/idempotency-context.js';
import { ClaimTransaction } from './claim-transaction.js';

/** A statement that writes: INSERT, UPDATE, DELETE, MERGE, TRUNCATE, or a WITH that does one. */
const WRITE =
  /^\s*(?:(?:INSERT|UPDATE|DELETE|MERGE|TRUNCATE)\b|WITH\b[\s\S]*\b(?:INSERT|UPDATE|DELETE|MERGE)\b)/i;
/** The table a write names first, quoted or not, with its schema if it has one. */
const TARGET =
  /^\s*(?:WITH\b[\s\S]*?\)\s*)?(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|MERGE\s+INTO|TRUNCATE(?:\s+TABLE)?)\s+(?:ONLY\s+)?((?:"(?:[^"]|"")+"|[\w$]+)(?:\s*\.\s*(?:"(?:[^"]|"")+"|[\w$]+))?)/i;

/**
 * Thrown (with `strictTransactions`) for a write outside the claim's transaction, before it runs:
 * the delivery fails and rolls back, and nothing is written.
 */
export class OutsideTransactionWriteError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'OutsideTransactionWriteError';
  }
}

/** The warning (or, strict, the error) for a handler that wrote outside its claim's transaction. */
function outsideWrite(scope: string, target: string, strict: boolean): string {
  return (
    `${scope} wrote to ${target} outside its claim's transaction, through another connection (an ` +
    `injected repository, the DataSource, or a transaction of its own) rather than the claim's manager ` +
    `(IdempotencyContext.manager or @WebhookTransaction()). That write commits on its own: a crash or ` +
    `a rollback of the claim leaves it behind, and the redelivery writes it again. ` +
    (strict
      ? 'Refused (strictTransactions): nothing was written.'
      : 'Said once per handler; strictTransactions: true refuses such writes.')
  );
}

/**
 * Finds the most common mistake with a library like this one: a transaction-mode handler (or a
 * service it calls) that writes through an injected repository or the DataSource instead of the
 * claim's manager. Such a write runs on another connection and commits on its own, which brings
 * back the very hole the claim closes. TypeORM announces every statement it sends to its
 * subscribers (`beforeQuery`, with the query runner that sends it): during a transaction-mode
 * delivery, a write sent through any runner but the claim's is reported once per handler, naming
 * the entity, or refused with `strictTransactions`. Raw SQL through pg (not TypeORM) is not seen.
 *
 * The claim path itself never sends through TypeORM, and this subscriber does not count as one
 * the claim's transaction must broadcast to (TransactionStrategy leaves it out).
 *
 * It also tells a delivery's ClaimTransaction of the transaction levels its handler opens on the
 * claim's runner (TypeORM's savepoints), so that what is registered inside one follows its fate
 * (ClaimTransaction.followHandlerLevel): the one subscriber every DataSource of the module has,
 * so that a delivery that opens none pays nothing for it.
 */
export class OutsideWriteSubscriber implements EntitySubscriberInterface {
  private readonly warned = new Set<string>();

  constructor(
    private readonly dataSource: DataSource,
    private readonly strict: boolean,
    private readonly logger: Logger,
  ) {}

  /** TypeORM's BeforeQueryEvent, as far as it is read here (0.3 and 1.x have the same fields). */
  beforeQuery(event: { query: string; queryRunner: QueryRunner }): void {
    const delivery = currentDelivery();
    if (!(delivery instanceof ClaimDelivery)) return;
    const transaction = delivery.handle;
    // External mode has no claim transaction, and a test's own delivery is not a claim.
    if (!(transaction instanceof ClaimTransaction) || transaction.ownsRunner(event.queryRunner)) return;
    if (!WRITE.test(event.query)) return;
    const target = this.describe(event.query);
    if (this.strict) throw new OutsideTransactionWriteError(outsideWrite(delivery.scope, target, true));
    if (this.warned.has(delivery.scope)) return;
    this.warned.add(delivery.scope);
    this.logger.warn(outsideWrite(delivery.scope, target, false));
  }

  /** TypeORM's TransactionStartEvent (0.3 and 1.x): a level opens on `queryRunner`. */
  beforeTransactionStart(event: { queryRunner: QueryRunner }): void {
    claimTransactionNow()?.followHandlerLevel(event.queryRunner, 'start');
  }

  /** TypeORM's TransactionCommitEvent: a level of `queryRunner` was released (or committed). */
  afterTransactionCommit(event: { queryRunner: QueryRunner }): void {
    claimTransactionNow()?.followHandlerLevel(event.queryRunner, 'commit');
  }

  /** TypeORM's TransactionRollbackEvent: a level of `queryRunner` was rolled back. */
  afterTransactionRollback(event: { queryRunner: QueryRunner }): void {
    claimTransactionNow()?.followHandlerLevel(event.queryRunner, 'rollback');
  }

  /** `entity Order (table "orders")`, or the table alone for one no entity maps. */
  private describe(query: string): string {
    const table = TARGET.exec(query)?.[1];
    if (!table) return 'the database';
    const bare = (name: string) => name.replace(/^"|"$/g, '').replace(/""/g, '"');
    const parts = table.split(/\s*\.\s*/).map(bare);
    const name = parts[parts.length - 1];
    const schema = parts.length > 1 ? parts[0] : undefined;
    const entity = this.dataSource.entityMetadatas.find(
      (metadata) => metadata.tableName === name && (schema === undefined || metadata.schema === schema),
    );
    return entity ? `entity ${entity.name} (table ${table})` : `table ${table}`;
  }
}

/** The current delivery's claim transaction (transaction mode), if any. */
function claimTransactionNow(): ClaimTransaction | undefined {
  const delivery = currentDelivery();
  if (!(delivery instanceof ClaimDelivery)) return undefined;
  return delivery.handle instanceof ClaimTransaction ? delivery.handle : undefined;
}

/** DataSources that already have the subscriber: several modules may share one. */
const watched = new WeakSet<DataSource>();

/**
 * Adds the subscriber to `dataSource` (once), after TypeORM has built its own from the options:
 * `DataSource.subscribers` is the list TypeORM announces statements to.
 */
export function watchOutsideWrites(dataSource: DataSource, strict: boolean, logger: Logger): void {
  if (watched.has(dataSource)) return;
  watched.add(dataSource);
  dataSource.subscribers.push(new OutsideWriteSubscriber(dataSource, strict, logger));
}

/** True for a subscriber other than the library's own: the claim's transaction must broadcast to it. */
export function isUsersSubscriber(subscriber: unknown): boolean {
  return !(subscriber instanceof OutsideWriteSubscriber);
}
