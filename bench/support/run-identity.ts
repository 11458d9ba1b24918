import { cpus } from 'node:os';

/**
 * The date and time a results file is named by, `YYYY-MM-DD-HHMM` in UTC (`2026-12-06-0106`):
 * bench/README's "Keeping a run" and the pages that link results rely on this one shape.
 */
export function resultStamp(at: Date = new Date()): string {
  return at
    .toISOString()
    .slice(0, 16)
    .replace(/[:T]/g, (c) => (c === 'T' ? '-' : ''));
}

/** The machine's CPUs as every results file describes them: `2× AMD EPYC`. */
export function cpuDescription(): string {
  return `${cpus().length}× ${cpus()[0]?.model.trim() ?? 'unknown'}`;
}
