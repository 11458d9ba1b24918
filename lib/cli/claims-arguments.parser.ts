import { parseArgs } from 'node:util';
import { closest } from '../core/closest-name.js';
import { DEFAULTS } from '../idempotency.constants.js';
import type { ClaimListOptions, ClaimListStatus } from '../interfaces/index.js';
import { DEFAULT_LIST_LIMIT } from '../operator/claims.operator.js';

/** A command line the CLI cannot run; its message says why. Exit code 2. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** The options every command takes: where the claims table is, and how the module is configured. */
export interface CommonClaimsOptions {
  schema?: string;
  table?: string;
  maxAttempts: number;
  json: boolean;
}

/** One parsed command line. */
export type ClaimsCommand =
  | { command: 'help' }
  | ({
      command: 'list';
      list: Required<Pick<ClaimListOptions, 'limit'>> & ClaimListOptions;
    } & CommonClaimsOptions)
  | ({ command: 'show' | 'release'; scope: string; key: string } & CommonClaimsOptions)
  | ({ command: 'forget'; scope: string; key: string; force: boolean } & CommonClaimsOptions);

const OPTIONS = {
  status: { type: 'string' },
  scope: { type: 'string' },
  'older-than': { type: 'string' },
  limit: { type: 'string' },
  force: { type: 'boolean' },
  schema: { type: 'string' },
  table: { type: 'string' },
  'max-attempts': { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

type OptionName = keyof typeof OPTIONS;

const COMMON: readonly OptionName[] = ['schema', 'table', 'max-attempts', 'json', 'help'];

/** The options each command takes beyond the common ones, and its positional arguments. */
const COMMANDS = {
  list: { options: ['status', 'scope', 'older-than', 'limit'], positionals: [] },
  show: { options: [], positionals: ['scope', 'key'] },
  release: { options: [], positionals: ['scope', 'key'] },
  forget: { options: ['force'], positionals: ['scope', 'key'] },
} as const satisfies Record<string, { options: readonly OptionName[]; positionals: readonly string[] }>;

const STATUSES: readonly ClaimListStatus[] = ['in_progress', 'expired', 'failed', 'poison', 'done'];

const UNIT_MS = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;

/** `10m`, `90s`, `1.5h`, `2d`, `500ms` → milliseconds; a bare number has no unit and is refused. */
export function parseAge(text: string): number {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/.exec(text);
  if (!match)
    throw new UsageError(
      `--older-than must be a number and a unit (ms, s, m, h, d), e.g. 10m; got '${text}'`,
    );
  return Number(match[1]) * UNIT_MS[match[2] as keyof typeof UNIT_MS];
}

function positiveInteger(option: string, text: string): number {
  if (!/^\d+$/.test(text) || Number(text) < 1 || !Number.isSafeInteger(Number(text)))
    throw new UsageError(`--${option} must be a whole number, 1 or more; got '${text}'`);
  return Number(text);
}

/** `; did you mean <name>?` when `given` is near one of `known`, as the module's options say it. */
function didYouMean(given: string, known: readonly string[], shown = (name: string) => name): string {
  const suggestion = closest(given, [...known]);
  return suggestion === undefined ? '' : `; did you mean ${shown(suggestion)}?`;
}

/**
 * The first `--name` of `argv` that is not an option of the CLI (before a `--` that ends the
 * options): parseArgs' error names it in its message only, with no suggestion.
 */
function unknownLongOption(argv: readonly string[]): string | undefined {
  for (const arg of argv) {
    if (arg === '--') return undefined;
    if (!arg.startsWith('--')) continue;
    const name = arg.slice(2).split('=')[0]!;
    if (!Object.hasOwn(OPTIONS, name)) return name;
  }
  return undefined;
}

/** The refusal of a first word that is not `claims`: `list` alone is a claims command without its group. */
function unknownGroup(group: string): string {
  const suggestion = Object.hasOwn(COMMANDS, group)
    ? `; did you mean 'claims ${group}'?`
    : didYouMean(group, ['claims'], (name) => `'${name}'`);
  return `Unknown command '${group}'${suggestion}`;
}

/** Parses `claims <command> ...` (the arguments after the program's name). */
export function parseClaimsArguments(argv: readonly string[]): ClaimsCommand {
  let parsed: ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true; strict: true }>>;
  try {
    parsed = parseArgs({ args: [...argv], options: OPTIONS, allowPositionals: true, strict: true });
  } catch (error) {
    const unknown =
      (error as { code?: string }).code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION'
        ? unknownLongOption(argv)
        : undefined;
    const suggestion =
      unknown === undefined ? '' : didYouMean(unknown, Object.keys(OPTIONS), (name) => `--${name}`);
    // parseArgs' own message goes on about positionals after `--`: a near option is the likelier fix.
    throw new UsageError(
      suggestion ? `Unknown option '--${unknown}'${suggestion}` : (error as Error).message,
    );
  }
  const { values, positionals } = parsed;
  if (values.help) return { command: 'help' };
  const [group, name, ...rest] = positionals;
  if (group !== 'claims') {
    throw new UsageError(group === undefined ? 'No command given' : unknownGroup(group));
  }
  if (name === undefined) throw new UsageError('claims needs a command: list, show, release or forget');
  if (!Object.hasOwn(COMMANDS, name)) {
    const suggestion = didYouMean(name, Object.keys(COMMANDS), (known) => `'claims ${known}'`);
    throw new UsageError(`Unknown command 'claims ${name}'${suggestion}`);
  }
  const command = name as keyof typeof COMMANDS;
  const spec = COMMANDS[command];

  const allowed = new Set<OptionName>([...COMMON, ...spec.options]);
  for (const option of Object.keys(values) as OptionName[]) {
    if (!allowed.has(option)) throw new UsageError(`claims ${command} takes no --${option}`);
  }
  if (rest.length !== spec.positionals.length) {
    const expected = spec.positionals.map((positional) => `<${positional}>`).join(' ');
    throw new UsageError(
      spec.positionals.length === 0
        ? `claims ${command} takes no arguments, got ${rest.map((arg) => `'${arg}'`).join(' ')}`
        : `claims ${command} needs ${expected}`,
    );
  }
  for (const [index, positional] of spec.positionals.entries()) {
    if (rest[index] === '') throw new UsageError(`claims ${command}: <${positional}> is empty`);
  }

  const common: CommonClaimsOptions = {
    schema: values.schema,
    table: values.table,
    maxAttempts:
      values['max-attempts'] === undefined
        ? DEFAULTS.maxAttempts
        : positiveInteger('max-attempts', values['max-attempts']),
    json: values.json === true,
  };
  switch (command) {
    case 'list': {
      const status = values.status;
      if (status !== undefined && !STATUSES.includes(status as ClaimListStatus)) {
        throw new UsageError(
          `--status must be one of ${STATUSES.join(', ')}; got '${status}'${didYouMean(status, STATUSES)}`,
        );
      }
      return {
        command,
        ...common,
        list: {
          status: status as ClaimListStatus | undefined,
          scope: values.scope,
          olderThanMs: values['older-than'] === undefined ? undefined : parseAge(values['older-than']),
          limit: values.limit === undefined ? DEFAULT_LIST_LIMIT : positiveInteger('limit', values.limit),
        },
      };
    }
    case 'forget':
      return { command, ...common, scope: rest[0], key: rest[1], force: values.force === true };
    default:
      return { command, ...common, scope: rest[0], key: rest[1] };
  }
}
