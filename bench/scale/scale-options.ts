import { parseArgs } from 'node:util';
import { DEFAULTS } from '../../lib/idempotency.constants.js';

/** Everything `npm run bench:scale` is shaped by; written into the results. */
export interface ScaleOptions {
  /** Rows in the claims table after the fill. */
  rows: number;
  /** Entities in the ordering guard's versions table after its fill (one row each). */
  entities: number;
  /** Days of traffic the rows are spread over. */
  days: number;
  /**
   * Expired leases to measure the maintenance statements at, ascending: the table is filled with
   * the first count, and leases are added before each next one.
   */
  expired: number[];
  /** Whether `--expired` was given (the default is a realistic share of the rows). */
  expiredGiven: boolean;
  /** Rows per INSERT of the fill. */
  chunkRows: number;
  /** Concurrent clients of the claim-throughput phase, and its seconds per claim mode. */
  clients: number;
  durationS: number;
  /** Runs of each maintenance statement under each plan mode. */
  runs: number;
  /** Committed retention batches in a row at the end (the table shrinks by as many batches). */
  retentionBatches: number;
  /** The library's options the maintenance statements are run with (its defaults). */
  retentionDays: number;
  retentionBatchSize: number;
  maxAttempts: number;
  /** With DATABASE_URL: keep the filled database instead of dropping it. */
  keep: boolean;
}

/** Rows of the default run: 35 days of a few events a second. */
export const DEFAULT_ROWS = 10_000_000;

const USAGE = `npm run bench:scale -- [--rows 10M] [--entities 10M] [--days 35] [--expired N[,N...]] [--clients 10]
  [--duration S] [--runs N] [--retention-batches N] [--chunk ROWS] [--keep]`;

/** `10M`, `200k`, `141000`. */
function count(value: string, option: string): number {
  const match = /^(\d+(?:\.\d+)?)([kKmM]?)$/.exec(value.trim().replace(/_/g, ''));
  if (!match) throw new Error(`--${option}: not a count: ${value}\n${USAGE}`);
  const factor = { '': 1, k: 1e3, K: 1e3, m: 1e6, M: 1e6 }[match[2]]!;
  return Math.round(Number(match[1]) * factor);
}

/** A realistic number of expired leases: one lease in 10,000 rows dies with its worker. */
export function realisticExpired(rows: number): number {
  return Math.max(10, Math.round(rows / 10_000));
}

/** Parses `npm run bench:scale -- ...`. */
export function parseScaleOptions(argv: string[]): ScaleOptions {
  const { values } = parseArgs({
    args: argv,
    options: {
      rows: { type: 'string' },
      days: { type: 'string', default: '35' },
      expired: { type: 'string' },
      entities: { type: 'string' },
      chunk: { type: 'string', default: '250k' },
      clients: { type: 'string', default: '10' },
      duration: { type: 'string', default: '10' },
      runs: { type: 'string', default: '7' },
      'retention-batches': { type: 'string', default: '20' },
      keep: { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const rows = values.rows === undefined ? DEFAULT_ROWS : count(values.rows, 'rows');
  if (rows < 10_000) throw new Error(`--rows: at least 10k rows\n${USAGE}`);
  const expired = values.expired
    ? [...new Set(values.expired.split(',').map((value) => count(value, 'expired')))].sort((a, b) => a - b)
    : [realisticExpired(rows)];
  const positive = (value: string, option: string) => {
    const parsed = Number(value);
    if (!(parsed > 0)) throw new Error(`--${option}: not a positive number: ${value}\n${USAGE}`);
    return parsed;
  };
  const days = positive(values.days, 'days');
  if (days <= DEFAULTS.retentionDays + 1) {
    throw new Error(
      `--days: more than ${DEFAULTS.retentionDays} days of retention, or retention has nothing to do`,
    );
  }
  const entities = values.entities === undefined ? DEFAULT_ROWS : count(values.entities, 'entities');
  if (entities < 1_000) throw new Error(`--entities: at least 1k entities\n${USAGE}`);
  return {
    rows,
    entities,
    days,
    expired,
    expiredGiven: values.expired !== undefined,
    chunkRows: count(values.chunk, 'chunk'),
    clients: Math.round(positive(values.clients, 'clients')),
    durationS: positive(values.duration, 'duration'),
    runs: Math.round(positive(values.runs, 'runs')),
    retentionBatches: Math.round(Number(values['retention-batches'])),
    retentionDays: DEFAULTS.retentionDays,
    retentionBatchSize: DEFAULTS.retentionBatchSize,
    maxAttempts: DEFAULTS.maxAttempts,
    keep: values.keep,
  };
}

/** `10M`, `200k`, `1.5M`: for file names and tables. */
export function shortCount(value: number): string {
  if (value >= 1e6 && value % 1e5 === 0) return `${value / 1e6}M`;
  if (value >= 1e3 && value % 100 === 0) return `${value / 1e3}k`;
  return String(value);
}
