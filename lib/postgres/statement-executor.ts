import type { Logger } from '@nestjs/common';
import type { QueryConfig, QueryResult } from 'pg';
import type { DataSource } from 'typeorm';
import { statementForgotten } from '../idempotency.messages.js';
import { errorCode, UNKNOWN_PREPARED_STATEMENT } from './pg-errors.js';
import { pgPoolOf } from './typeorm-internals.js';

/** A statement of the per-delivery path, with the name pg prepares it under. */
export interface ClaimStatement {
  readonly name: string;
  readonly text: string;
}

/**
 * The pg query for `statement`. Named, pg parses it once per connection and Postgres reuses the
 * plan on every later delivery; unnamed (`prepared: false`), it is parsed and planned each time,
 * which a pooler in transaction mode that does not track prepared statements needs.
 */
export function claimQuery(statement: ClaimStatement, values: unknown[], prepared: boolean): QueryConfig {
  return prepared ? { name: statement.name, text: statement.text, values } : { text: statement.text, values };
}

/** Sends of one statement whose connections had forgotten it (see execute()). */
const MAX_STATEMENT_SENDS = 3;
/** The forgotten-statement warning repeats at most this often. */
const FORGOTTEN_WARNING_EVERY_MS = 60_000;

/**
 * Sends autocommitted claim statements on the DataSource's pg pool, as hand-written SQL would:
 * no QueryRunner, and prepared when `prepared` is set. pg remembers what it prepared on each
 * connection; when someone has run DEALLOCATE ALL or DISCARD ALL on one, the statement fails
 * there without running, pg-pool drops that connection, and it is sent again on another, where pg
 * prepares it anew. Each such miss costs a new connection, so it is logged: many of them mean a
 * pooler in transaction mode.
 */
export class StatementExecutor {
  private lastForgottenWarning = -Infinity;

  constructor(
    private readonly dataSource: DataSource,
    private readonly prepared: boolean,
    private readonly logger: Logger,
  ) {}

  async execute(statement: ClaimStatement, parameters: unknown[]): Promise<QueryResult> {
    const query = claimQuery(statement, parameters, this.prepared);
    for (let send = 1; ; send++) {
      try {
        return await pgPoolOf(this.dataSource).query(query);
      } catch (error) {
        if (send >= MAX_STATEMENT_SENDS || errorCode(error) !== UNKNOWN_PREPARED_STATEMENT) throw error;
        const now = Date.now();
        if (now - this.lastForgottenWarning >= FORGOTTEN_WARNING_EVERY_MS) {
          this.lastForgottenWarning = now;
          this.logger.warn(statementForgotten(statement.name));
        }
      }
    }
  }

  /** Rows a fenced UPDATE changed. */
  async update(statement: ClaimStatement, parameters: unknown[]): Promise<number> {
    return (await this.execute(statement, parameters)).rowCount ?? 0;
  }
}
