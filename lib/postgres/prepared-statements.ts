import type { Logger } from '@nestjs/common';

const statementForgotten = (name: string, code: string) =>
  `The prepared statement ${name} was not what this connection's server session had (SQLSTATE ${code}: DEALLOCATE ALL, DISCARD ALL, or a pooler in transaction mode); it was sent again unprepared`;

const preparedStatementsOff = (name: string, code: string, misses: number) =>
  `Prepared statements turned off: ${misses} statements (the last ${name}, SQLSTATE ${code}) met server sessions that did not have them as this connection did, as behind a transaction-mode pooler (PgBouncer, Supavisor). The claims now go unprepared; set preparedStatements: false to skip this detection`;

/** The `preparedStatements` option. */
export type PreparedStatementsOption = boolean | 'auto';

/**
 * Misses after which `'auto'` stops preparing. A direct connection misses only when someone runs
 * DEALLOCATE ALL or DISCARD ALL on it; behind a transaction-mode pooler (PgBouncer before 1.21 in
 * `pool_mode = transaction`, RDS Proxy, Supavisor) misses come with nearly every delivery.
 */
const MISSES_BEFORE_OFF = 3;
/** A miss warning repeats at most this often while statements stay prepared. */
const MISS_WARNING_EVERY_MS = 60_000;

/**
 * Whether the claim path prepares its statements; one per module, shared by its strategies. A
 * miss is a statement that failed without running because the server connection's prepared state
 * was not what pg believed: 26000 (the server connection never prepared it) or 42P05 (it already
 * has it). The caller resends the statement unprepared, so a miss costs a round trip, never a 503.
 * With `'auto'` (the default) a few misses turn preparing off for good, and the module says so
 * once; `true` keeps preparing (and resending); `false` never prepares.
 */
export class PreparedStatements {
  private enabled: boolean;
  private misses = 0;
  private lastWarning = -Infinity;

  constructor(
    private readonly option: PreparedStatementsOption,
    private readonly logger: Logger,
  ) {
    this.enabled = option !== false;
  }

  /** Whether statements are prepared now. */
  get active(): boolean {
    return this.enabled;
  }

  /** Misses so far: statements that met a server session whose prepared state was not the expected one. */
  get missCount(): number {
    return this.misses;
  }

  /** Records a miss of `name` (SQLSTATE `code`); the caller resends the statement unprepared. */
  missed(name: string, code: string): void {
    this.misses++;
    if (this.option === 'auto' && this.enabled && this.misses >= MISSES_BEFORE_OFF) {
      this.enabled = false;
      this.logger.warn(preparedStatementsOff(name, code, this.misses));
      return;
    }
    if (!this.enabled) return;
    const now = Date.now();
    if (now - this.lastWarning < MISS_WARNING_EVERY_MS) return;
    this.lastWarning = now;
    this.logger.warn(statementForgotten(name, code));
  }
}
