import type { Logger } from '@nestjs/common';
import type { DataSource, EntitySubscriberInterface, QueryRunner } from 'typeorm';
import { ClaimDelivery } from '../core/claim-delivery.js';
import { currentDelivery } from '../core/idempotency-context.js';
import { ClaimTransaction } from './claim-transaction.js';
import {
  loadStatementClassifier,
  quoted,
  type StatementClass,
  type StatementClassifier,
  type WrittenTable,
} from './statement.classifier.js';

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

/** How a statement reached the database without the claim's transaction. */
const ANOTHER_CONNECTION =
  `outside its claim's transaction, through another connection (an injected repository, the ` +
  `DataSource, or a transaction of its own) rather than the claim's manager ` +
  `(IdempotencyContext.manager or @WebhookTransaction())`;

/** The warning (or, strict, the error) for a handler that wrote outside its claim's transaction. */
function outsideWrite(scope: string, target: string, strict: boolean): string {
  return (
    `${scope} wrote to ${target} ${ANOTHER_CONNECTION}. That write commits on its own: a crash or ` +
    `a rollback of the claim leaves it behind, and the redelivery writes it again. ` +
    (strict
      ? 'Refused (strictTransactions): nothing was written.'
      : 'Said once per handler; strictTransactions: true refuses such writes.')
  );
}

/** The warning for a statement whose effect its text does not show (a function of the app's own...). */
function outsideUndecided(scope: string, found: StatementClass): string {
  return (
    `${scope} sent a statement (${found.kind}) ${ANOTHER_CONNECTION}: it ${found.reason}. Anything it ` +
    `writes commits on its own, whatever becomes of the claim; send it through the claim's manager ` +
    `if it does. Said once per handler, and not refused, even with strictTransactions: its effect ` +
    `cannot be told from its text.`
  );
}

/** Refused at boot: the check is on in every app, so the parser it runs on must load. */
const parserDidNotLoad = (error: unknown) =>
  `IdempotencyModule cannot start: PostgreSQL's parser (the libpg-query package), on which the ` +
  `check of writes outside a claim's transaction runs, did not load (${error instanceof Error ? error.message : String(error)}). ` +
  `Reinstall the package's dependencies (npm ci).`;

/**
 * Finds the most common mistake with a library like this one: a transaction-mode handler (or a
 * service it calls) that writes through an injected repository or the DataSource instead of the
 * claim's manager. Such a write runs on another connection and commits on its own, which brings
 * back the very hole the claim closes. TypeORM announces every statement it sends to its
 * subscribers (`beforeQuery`, with the query runner that sends it): during a transaction-mode
 * delivery, a statement sent through any runner but the claim's is classified by PostgreSQL's own
 * parser (StatementClassifier, cached per text). A write is reported once per handler, naming the
 * entity, or refused with `strictTransactions`; a statement whose effect its text cannot show (a
 * function of the app's own, CALL, DO) is reported once per handler and never refused. Raw SQL
 * through pg (not TypeORM) is not seen.
 *
 * The claim path itself never sends through TypeORM, and this subscriber does not count as one
 * the claim's transaction must broadcast to (TransactionStrategy leaves it out). Statements on the
 * claim's own runner return before any parsing: the happy path pays nothing.
 *
 * It also tells a delivery's ClaimTransaction of the transaction levels its handler opens on the
 * claim's runner (TypeORM's savepoints), so that what is registered inside one follows its fate
 * (ClaimTransaction.followHandlerLevel): the one subscriber every DataSource of the module has,
 * so that a delivery that opens none pays nothing for it.
 */
export class OutsideWriteSubscriber implements EntitySubscriberInterface {
  /** Handlers (scopes) told of a write, and of an undecided statement: each said once. */
  private readonly warned = new Set<string>();
  private readonly reported = new Set<string>();

  constructor(
    private readonly dataSource: DataSource,
    private readonly strict: boolean,
    private readonly logger: Logger,
    private readonly classifier: StatementClassifier,
  ) {}

  /** TypeORM's BeforeQueryEvent, as far as it is read here (0.3 and 1.x have the same fields). */
  beforeQuery(event: { query: string; queryRunner: QueryRunner }): void {
    const delivery = currentDelivery();
    if (!(delivery instanceof ClaimDelivery)) return;
    const transaction = delivery.handle;
    // External mode has no claim transaction, and a test's own delivery is not a claim.
    if (!(transaction instanceof ClaimTransaction) || transaction.ownsRunner(event.queryRunner)) return;
    const found = this.classifier.classify(event.query);
    if (found.effect === 'read') return;
    if (found.effect === 'undecided') {
      if (this.reported.has(delivery.scope)) return;
      this.reported.add(delivery.scope);
      this.logger.warn(outsideUndecided(delivery.scope, found));
      return;
    }
    if (this.strict) {
      throw new OutsideTransactionWriteError(outsideWrite(delivery.scope, this.describe(found.tables), true));
    }
    if (this.warned.has(delivery.scope)) return;
    this.warned.add(delivery.scope);
    this.logger.warn(outsideWrite(delivery.scope, this.describe(found.tables), false));
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

  /** `entity Order (table "orders")`, or the table alone for one no entity maps; each table written. */
  private describe(tables: readonly WrittenTable[]): string {
    if (tables.length === 0) return 'the database';
    return tables
      .map((table) => {
        const entity = this.dataSource.entityMetadatas.find(
          (metadata) =>
            metadata.tableName === table.name &&
            (table.schema === undefined || metadata.schema === table.schema),
        );
        return entity ? `entity ${entity.name} (table ${quoted(table)})` : `table ${quoted(table)}`;
      })
      .join(', ');
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
 * `DataSource.subscribers` is the list TypeORM announces statements to. Loads PostgreSQL's parser
 * first (once per process), so that `beforeQuery` classifies synchronously; fails the boot if it
 * cannot load.
 */
export async function watchOutsideWrites(
  dataSource: DataSource,
  strict: boolean,
  logger: Logger,
): Promise<void> {
  if (watched.has(dataSource)) return;
  const classifier = await loadStatementClassifier().catch((error: unknown) => {
    throw new Error(parserDidNotLoad(error));
  });
  // Another module on this DataSource may have finished its own load meanwhile.
  if (watched.has(dataSource)) return;
  watched.add(dataSource);
  dataSource.subscribers.push(new OutsideWriteSubscriber(dataSource, strict, logger, classifier));
}

/** True for a subscriber other than the library's own: the claim's transaction must broadcast to it. */
export function isUsersSubscriber(subscriber: unknown): boolean {
  return !(subscriber instanceof OutsideWriteSubscriber);
}
