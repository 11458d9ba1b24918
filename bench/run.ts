import { randomBytes } from 'node:crypto';
import { loadavg } from 'node:os';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import * as prettier from 'prettier';
import { baselineWarmS } from './baseline-comparison.js';
import { skippedLine } from './baseline-pairs.js';
import { parseBenchOptions } from './bench-options.js';
import { summarize, type AdapterResult, type BenchRun } from './report/bench-result.js';
import { renderMarkdown, renderPathsSummary, renderReadmeSummary } from './report/markdown.js';
import { runAdapter } from './run-adapter.js';
import { checkoutBaseline, type BaselineCheckout } from './support/baseline-checkout.js';
import { startBenchPostgres } from './support/bench-postgres.js';
import { cpuDescription, resultStamp } from './support/run-identity.js';

/**
 * `npm run bench`: starts PostgreSQL, then per adapter a bench server in its own process, and
 * loads it from this process. Writes bench/results/<date>-<adapters>[-quick].{md,json}; a full
 * run also writes bench/results/latest.json and the latest table into bench/README.md.
 * `--baseline <git-ref>` also checks that ref out into a temporary worktree and measures its own
 * bench server in the headline repetitions (bench/baseline-comparison.ts); the name gets `-vs-<sha>`.
 */
const REPO_DIR = fileURLToPath(new URL('../../', import.meta.url));
const BENCH_DIR = fileURLToPath(new URL('../../bench/', import.meta.url));
const RESULTS_DIR = join(BENCH_DIR, 'results');
const PROFILES_DIR = join(BENCH_DIR, 'profiles');
const README = join(BENCH_DIR, 'README.md');
const LATEST = { start: '<!-- latest:start -->', end: '<!-- latest:end -->' };
const PATHS = { start: '<!-- paths:start -->', end: '<!-- paths:end -->' };

const options = parseBenchOptions(process.argv.slice(2));
const began = Date.now();
const stamp = resultStamp();
// Before PostgreSQL starts: a ref that does not exist or does not compile fails the run at once.
const baseline = options.baseline ? await checkoutBaseline(options.baseline, REPO_DIR) : undefined;
if (baseline) {
  const skipped = skippedLine(baseline.commit.slice(0, 7), baseline.pairs.skipped);
  if (skipped) console.log(`[bench] baseline ${skipped}`);
  // An interrupted run must not leave a worktree registered in the repository.
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      baseline.remove();
      process.kill(process.pid, signal);
    });
  }
}
const name =
  `${stamp}-${options.adapters.join('-')}${options.mode === 'quick' ? '-quick' : ''}` +
  (options.latencyMs.length ? `-latency-${options.latencyMs.join('-')}ms` : '') +
  (options.unprepared ? '-unprepared' : '') +
  (options.pathsOnly ? '-paths-only' : '') +
  (baseline ? `-vs-${baseline.commit.slice(0, 7)}` : '');
await mkdir(RESULTS_DIR, { recursive: true });
await mkdir(PROFILES_DIR, { recursive: true });

const postgres = await startBenchPostgres().catch((error: unknown) => {
  baseline?.remove();
  throw error;
});
const adapters: AdapterResult[] = [];
try {
  const environment = {
    node: process.version,
    cpu: cpuDescription(),
    'load average at start': loadavg()[0].toFixed(2),
    database: postgres.description,
    pg_stat_statements: postgres.statementStats ? 'on' : 'off',
  };
  for (const adapter of options.adapters) {
    const target = {
      profilesDir: PROFILES_DIR,
      stamp,
      runTag: randomBytes(3).toString('hex'),
    };
    adapters.push(await runAdapter(adapter, options, postgres, target, baseline));
  }
  const run: BenchRun = {
    mode: options.mode,
    options,
    environment,
    ...(baseline && {
      baseline: {
        ref: baseline.ref,
        commit: baseline.commit,
        subject: baseline.subject,
        current: baseline.current,
        database: baseline.sameSchema ? ('shared' as const) : ('own' as const),
        serverChanged: baseline.serverChanged,
        skipped: baseline.pairs.skipped,
        warmS: baselineWarmS(options),
      },
    }),
    adapters,
  };
  const markdown = renderMarkdown(run);
  await writeFile(join(RESULTS_DIR, `${name}.json`), `${JSON.stringify(run, null, 2)}\n`);
  await writeFile(join(RESULTS_DIR, `${name}.md`), markdown);
  const summaries = adapters.map(summarize);
  // A full run also refreshes the README's figures; a paths-only run, only the network paths'.
  const fullHeadline = options.mode === 'full' && !options.pathsOnly;
  if (fullHeadline) {
    const latest = {
      generatedAt: new Date().toISOString(),
      file: `bench/results/${name}.json`,
      ...summaries[0],
      adapters: Object.fromEntries(summaries.map((summary) => [summary.adapter, summary])),
    };
    await writeFile(join(RESULTS_DIR, 'latest.json'), `${JSON.stringify(latest, null, 2)}\n`);
    await writeIntoReadme(LATEST, renderReadmeSummary(run, `results/${name}.md`));
  }
  if (options.mode === 'full' && adapters.some((result) => result.paths)) {
    await writeIntoReadme(PATHS, renderPathsSummary(run, `results/${name}.md`));
  }
  console.log(`[bench] wrote bench/results/${name}.{md,json}${fullHeadline ? ' and latest.json' : ''}`);
  for (const summary of summaries) {
    console.log(
      `[bench] ${summary.adapter}: ${JSON.stringify({ ratios: summary.ratios, storm: summary.storm })}`,
    );
  }
  if (baseline) printBaseline(baseline, adapters);
  printPaths(adapters);
  console.log(`[bench] done in ${((Date.now() - began) / 1000).toFixed(1)} s`);
} finally {
  try {
    await postgres.stop();
  } finally {
    baseline?.remove();
  }
}

/** Both servers' headline ratios and the direct ones, per adapter. */
function printBaseline(baseline: BaselineCheckout, adapters: AdapterResult[]): void {
  const figure = ({ median, min, max }: { median: number; min: number; max: number }) =>
    `${median.toFixed(3)} (${min.toFixed(3)}–${max.toFixed(3)})`;
  const name = baseline.commit.startsWith(baseline.ref)
    ? baseline.commit.slice(0, 7)
    : `${baseline.ref} (${baseline.commit.slice(0, 7)})`;
  console.log(`[bench] against ${name}, median (min–max):`);
  const skipped = skippedLine(name, baseline.pairs.skipped);
  if (skipped) console.log(`[bench] baseline ${skipped}`);
  for (const result of adapters) {
    for (const [pair, ratios] of Object.entries(result.baseline ?? {})) {
      const lib = pair.split('/')[0];
      console.log(
        `[bench] ${result.adapter} ${pair}: current ${figure(ratios.current)}, baseline ${figure(ratios.baseline)}; ` +
          `${lib} current/baseline ${figure(ratios.direct)} (control, raw current/baseline ${figure(ratios.directRaw)})`,
      );
    }
  }
}

/** Each path's lib/raw medians, and what preparing costs, per adapter. */
function printPaths(adapters: AdapterResult[]): void {
  for (const result of adapters) {
    for (const ratio of result.paths?.ratios ?? []) {
      console.log(
        `[bench] ${result.adapter} ${ratio.path} ${ratio.pair} ${ratio.workload}: ${ratio.median.toFixed(3)} ` +
          `(${ratio.min.toFixed(3)}–${ratio.max.toFixed(3)})` +
          (ratio.unprepared ? `; unprepared ${ratio.unprepared.median.toFixed(3)}` : ''),
      );
    }
    for (const cost of result.paths?.prepared ?? []) {
      console.log(
        `[bench] ${result.adapter} ${cost.path} ${cost.pair.split('/')[0]} unprepared/prepared ` +
          `${cost.lib.median.toFixed(3)} (${cost.lib.min.toFixed(3)}–${cost.lib.max.toFixed(3)}), ` +
          `control ${cost.control.median.toFixed(3)} (${cost.control.min.toFixed(3)}–${cost.control.max.toFixed(3)})`,
      );
    }
  }
}

/** Replaces the tables between two markers in bench/README.md. */
async function writeIntoReadme(markers: { start: string; end: string }, summary: string): Promise<void> {
  const readme = await readFile(README, 'utf8').catch(() => '');
  const start = readme.indexOf(markers.start);
  const end = readme.indexOf(markers.end);
  if (start < 0 || end < start) return;
  const updated = `${readme.slice(0, start + markers.start.length)}\n\n${summary}\n\n${readme.slice(end)}`;
  // The README is checked by `prettier --check` in CI; the generated tables must pass it.
  const config = (await prettier.resolveConfig(README)) ?? {};
  await writeFile(README, await prettier.format(updated, { ...config, filepath: README }));
}
