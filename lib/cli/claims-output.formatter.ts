import type { ClaimRecord } from '../interfaces/index.js';

/** Longest last error shown in a table cell; `show` and `--json` print it whole. */
const MAX_ERROR_CELL = 60;

const CONTROL = /[\u0000-\u001f\u007f-\u009f]/g; // eslint-disable-line no-control-regex

/**
 * Keys and errors come from senders and handlers: a newline or an escape sequence in one must not
 * break the table or the terminal, so control characters are shown escaped.
 */
function printable(text: string): string {
  return text.replace(CONTROL, (char) => `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** `850ms`, `42s`, `3m 4s`, `2h 5m`, `3d 4h`: the two largest units. */
export function formatDuration(ms: number): string {
  if (ms < 1_000) return `${Math.max(0, Math.round(ms))}ms`;
  const units: [string, number][] = [
    ['d', 86_400],
    ['h', 3_600],
    ['m', 60],
    ['s', 1],
  ];
  let seconds = Math.floor(ms / 1_000);
  const parts: string[] = [];
  for (const [unit, size] of units) {
    if (seconds >= size || (parts.length > 0 && parts.length < 2)) {
      parts.push(`${Math.floor(seconds / size)}${unit}`);
      seconds %= size;
    }
    if (parts.length === 2) break;
  }
  return parts.join(' ');
}

const statusText = (claim: ClaimRecord) => (claim.poison ? `${claim.status} (poison)` : claim.status);

/** Claims as an aligned table, with a count line; `limit` says when more may exist. */
export function formatClaimsTable(claims: readonly ClaimRecord[], limit: number): string {
  if (claims.length === 0) return 'No claims.\n';
  const header = ['SCOPE', 'KEY', 'STATUS', 'ATTEMPTS', 'AGE', 'LEASE LEFT', 'LAST ERROR'];
  const rows = claims.map((claim) => {
    const error = claim.lastError === null ? '' : printable(claim.lastError);
    return [
      printable(claim.scope),
      printable(claim.key),
      statusText(claim),
      String(claim.attempts),
      formatDuration(claim.ageMs),
      claim.leaseLeftMs === null ? '' : formatDuration(claim.leaseLeftMs),
      error.length > MAX_ERROR_CELL ? `${error.slice(0, MAX_ERROR_CELL - 3)}...` : error,
    ];
  });
  const widths = header.map((title, column) =>
    Math.max(title.length, ...rows.map((row) => row[column].length)),
  );
  const line = (cells: string[]) =>
    cells
      .map((cell, column) => (column === cells.length - 1 ? cell : cell.padEnd(widths[column])))
      .join('  ')
      .trimEnd();
  const count =
    claims.length === limit
      ? `${claims.length} claims (the limit; --limit to see more)`
      : `${claims.length} ${claims.length === 1 ? 'claim' : 'claims'}`;
  return `${[line(header), ...rows.map(line)].join('\n')}\n${count}\n`;
}

/** One claim, a field a line. */
export function formatClaim(claim: ClaimRecord): string {
  const when = (date: Date | null) => (date === null ? '-' : date.toISOString());
  const lease =
    claim.leaseExpiresAt === null
      ? '-'
      : `${when(claim.leaseExpiresAt)}${claim.leaseLeftMs === null ? '' : ` (${formatDuration(claim.leaseLeftMs)} left)`}`;
  const fields: [string, string][] = [
    ['scope', printable(claim.scope)],
    ['key', printable(claim.key)],
    ['source', printable(claim.source)],
    ['status', statusText(claim)],
    ['attempts', String(claim.attempts)],
    ['claimed at', `${when(claim.claimedAt)} (${formatDuration(claim.ageMs)} ago)`],
    ['lease expires', lease],
    ['lease token', claim.leaseToken ?? '-'],
    ['completed at', when(claim.completedAt)],
    ['last error', claim.lastError === null ? '-' : printable(claim.lastError)],
  ];
  const width = Math.max(...fields.map(([name]) => name.length));
  return `${fields.map(([name, value]) => `${name.padEnd(width)}  ${value}`).join('\n')}\n`;
}

/** `--json` output: dates as ISO strings. */
export function formatJson(value: unknown): string {
  return `${JSON.stringify(value, null, 2)}\n`;
}
