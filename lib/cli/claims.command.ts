import pg from 'pg';
import { DEFAULTS } from '../idempotency.constants.js';
import { claimForgotten, claimNotFound, claimReleased } from '../idempotency.messages.js';
import { ClaimsOperator } from '../operator/claims.operator.js';
import { claimTable, type ClaimTable } from '../postgres/claim-table.js';
import { errorCode } from '../postgres/pg-errors.js';
import { parseClaimsArguments, UsageError, type ClaimsCommand } from './claims-arguments.parser.js';
import { formatClaim, formatClaimsTable, formatJson } from './claims-output.formatter.js';
import { describeError } from '../idempotency.messages.js';

const cliUsage = () => `Usage: nest-idempotent-webhooks claims <command> [options]

Commands:
  claims list [--status <status>] [--scope <scope>] [--older-than <age>] [--limit <n>] [--json]
      Claims, most recently claimed first. <status>: in_progress (a live lease), expired (a lease
      that ran out), failed, poison (not done after --max-attempts attempts), done.
      <age>: a number and a unit, ms s m h d (10m, 2h). --limit defaults to 100.
  claims show <scope> <key> [--json]
      One claim.
  claims release <scope> <key> [--json]
      Takes an in-progress lease away from its holder: the next delivery claims it at once.
  claims forget <scope> <key> --force [--json]
      Deletes a done, failed or expired claim: the next delivery runs the handler again.

Options of every command:
  --schema <schema>        the module's schema option (default: the connection's search_path)
  --table <table>          the module's table option (default: processed_events)
  --max-attempts <n>       the module's maxAttempts option, for poison (default: 5)
  --json                   JSON on stdout instead of text
  -h, --help               this text

Environment: DATABASE_URL, the PostgreSQL connection string of the app's database.
Exit codes: 0 done, 1 refused (nothing changed, or no such claim), 2 usage error, 3 database error.`;

const cliUsageError = (detail: string) => `${detail}\nRun nest-idempotent-webhooks claims --help for usage.`;

const cliDatabaseUrlMissing = () =>
  'DATABASE_URL is not set: give the PostgreSQL connection string of the app database in it';

const cliDatabaseFailed = (command: string, error: unknown) =>
  `claims ${command} failed: ${describeError(error)}`;

const cliTableMissing = (table: string) =>
  `the claims table ${table} does not exist in this database: check DATABASE_URL, and give --schema and --table as the module's schema and table options`;

/** The CLI's exit codes. */
export const EXIT = {
  /** The command did what it was asked. */
  ok: 0,
  /** Refused, nothing changed: no such claim, a state the action does not take, `--force` missing. */
  refused: 1,
  /** The command line is wrong (or DATABASE_URL is missing). */
  usage: 2,
  /** The database failed: unreachable, refused the login, no claims table. */
  database: 3,
} as const;

/** Where the CLI writes. */
export interface CliOutput {
  out(text: string): void;
  err(text: string): void;
}

/** Undefined table (SQLSTATE 42P01): DATABASE_URL, --schema or --table points elsewhere. */
const UNDEFINED_TABLE = '42P01';
/** A CLI that cannot reach its database says so rather than hang. */
const CONNECT_TIMEOUT_MS = 10_000;

/**
 * `nest-idempotent-webhooks claims ...`: the operator tools from a shell, on a pg client of their
 * own (no Nest app), with the statements `IdempotencyClaims` sends. Returns the exit code.
 */
export async function runClaimsCommand(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  output: CliOutput,
): Promise<number> {
  let command: ClaimsCommand;
  let table: ClaimTable;
  try {
    command = parseClaimsArguments(argv);
    if (command.command === 'help') {
      output.out(`${cliUsage()}\n`);
      return EXIT.ok;
    }
    if (!env.DATABASE_URL) throw new UsageError(cliDatabaseUrlMissing());
    table = claimTable(command.schema, command.table);
  } catch (error) {
    output.err(`${cliUsageError((error as Error).message)}\n`);
    return EXIT.usage;
  }

  const client = new pg.Client({
    connectionString: env.DATABASE_URL,
    application_name: 'nest-idempotent-webhooks claims',
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
  });
  // A connection lost between statements is reported by the next one; unheard, it would crash.
  client.on('error', () => undefined);
  try {
    await client.connect();
    const operator = new ClaimsOperator((text, values) => client.query(text, values), {
      table,
      maxAttempts: command.maxAttempts,
      lockWaitMs: DEFAULTS.concurrentDuplicateWaitMs,
    });
    return await execute(command, operator, output);
  } catch (error) {
    output.err(
      `${errorCode(error) === UNDEFINED_TABLE ? cliTableMissing(table.sql) : cliDatabaseFailed(command.command, error)}\n`,
    );
    return EXIT.database;
  } finally {
    await client.end().catch(() => undefined);
  }
}

async function execute(
  command: Exclude<ClaimsCommand, { command: 'help' }>,
  operator: ClaimsOperator,
  output: CliOutput,
): Promise<number> {
  switch (command.command) {
    case 'list': {
      const claims = await operator.list(command.list);
      output.out(command.json ? formatJson(claims) : formatClaimsTable(claims, command.list.limit));
      return EXIT.ok;
    }
    case 'show': {
      const claim = await operator.show(command.scope, command.key);
      if (!claim) {
        if (command.json) output.out(formatJson(null));
        output.err(`${claimNotFound(command.scope, command.key)}\n`);
        return EXIT.refused;
      }
      output.out(command.json ? formatJson(claim) : formatClaim(claim));
      return EXIT.ok;
    }
    case 'release': {
      const result = await operator.release(command.scope, command.key);
      if (command.json) output.out(formatJson(result));
      if (!result.released) {
        output.err(`${result.refusal.message}\n`);
        return EXIT.refused;
      }
      if (!command.json) {
        output.out(
          `${claimReleased(command.scope, command.key, result.claim.attempts, result.leaseWasLive)}\n`,
        );
      }
      return EXIT.ok;
    }
    case 'forget': {
      const result = await operator.forget(command.scope, command.key, { force: command.force });
      if (command.json) output.out(formatJson(result));
      if (!result.forgotten) {
        output.err(`${result.refusal.message}\n`);
        return EXIT.refused;
      }
      if (!command.json) {
        output.out(
          `${claimForgotten(command.scope, command.key, result.claim.status, result.claim.attempts)}\n`,
        );
      }
      return EXIT.ok;
    }
  }
}
