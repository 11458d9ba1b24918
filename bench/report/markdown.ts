import type { TracedQuery } from '../server/query-counter.js';
import { VARIANT_DESCRIPTIONS, VARIANTS, WORKLOADS, type Workload } from '../variants.js';
import type { AdapterResult, BaselineInfo, BenchRun, CellResult, Spread } from './bench-result.js';

const pct = (share: number) => `${(share * 100).toFixed(1)}%`;
const spreadCell = (spread: Spread) =>
  `**${spread.median.toFixed(3)}** (${spread.min.toFixed(3)}–${spread.max.toFixed(3)})`;

/** The ref as given, and the commit it names unless the ref is that commit's hash. */
function baselineName(info: BaselineInfo): string {
  return info.commit.startsWith(info.ref)
    ? `\`${info.commit.slice(0, 7)}\``
    : `\`${info.ref}\` (${info.commit.slice(0, 7)})`;
}

/** One line on which code the baseline is and how it ran. */
function baselineLine(info: BaselineInfo): string {
  return (
    `Baseline ${baselineName(info)}, "${info.subject}": its own lib and bench server, ` +
    `compiled in a temporary git worktree, in a second server process on ` +
    (info.database === 'shared'
      ? 'the same database (its schema is the current one)'
      : 'its own fresh database (its schema differs from the current one)') +
    `, each headline route warmed ${info.warmS} s. Current: ${info.current.commit.slice(0, 7)}` +
    (info.current.dirty ? ' with uncommitted changes in lib/ or bench/' : '') +
    '.' +
    (info.serverChanged
      ? ' **Its bench/server differs from the current one**: the raw-* routes are not the same code on both sides.'
      : ' Its bench/server is the same code as the current one.')
  );
}

/** Both servers' headline ratios and the direct ones, one row per adapter. */
function baselineTable(run: BenchRun): string[] {
  const info = run.baseline;
  const measured = run.adapters.filter((result) => result.baseline);
  if (!info || measured.length === 0) return [];
  const lines = [
    `Against ${baselineName(info)}, interleaved in the same repetitions (median, min–max):`,
    '',
    '| adapter | pair | current lib/raw | baseline lib/raw | current lib / baseline lib | control: current raw / baseline raw |',
    '|---|---|---:|---:|---:|---:|',
  ];
  for (const result of measured) {
    for (const [pair, ratios] of Object.entries(result.baseline!)) {
      lines.push(
        `| ${result.adapter} | ${pair} | ${spreadCell(ratios.current)} | ${spreadCell(ratios.baseline)} | ` +
          `${spreadCell(ratios.direct)} | ${spreadCell(ratios.directRaw)} |`,
      );
    }
  }
  return lines;
}

/** A statement as a short label: `START TRANSACTION`, `INSERT INTO orders`, ... */
function label(query: TracedQuery): string {
  const sql = query.sql;
  if (sql.startsWith('WITH bound')) return 'claim (INSERT … ON CONFLICT, lock_timeout via set_config)';
  const insert = /^INSERT INTO (\w+)/.exec(sql);
  if (insert)
    return insert[1] === 'orders'
      ? 'insert order'
      : `INSERT INTO ${insert[1]}${sql.includes('DO UPDATE') ? ' … DO UPDATE' : ''}`;
  const update = /^UPDATE processed_events SET status = '(\w+)'/.exec(sql);
  if (update) return `UPDATE → ${update[1]}`;
  if (sql.startsWith('SELECT status')) return 'SELECT status';
  return sql.length > 40 ? `${sql.slice(0, 37)}...` : sql;
}

function statusCell(statuses: Record<string, number>): string {
  return Object.entries(statuses)
    .map(([status, count]) => `${count}× ${status}`)
    .join(', ');
}

function cellsTable(result: AdapterResult, workload: Workload): string[] {
  const cells = result.cells.filter((cell) => cell.workload === workload);
  const none = cells.find((cell) => cell.variant === 'none');
  const rows = cells.map((cell: CellResult) => {
    const { load, server, database, effect } = cell;
    const errors = load.non2xx + load.errors;
    return (
      `| ${cell.variant} | ${load.eventsPerSecond} | ${none ? (load.eventsPerSecond / none.load.eventsPerSecond).toFixed(2) : ''} ` +
      `| ${load.latencyMs.p50} | ${load.latencyMs.p99} | ${load.latencyMs.max} | ${errors} ` +
      `| ${server.statementsPerEvent} | ${server.roundTripsPerEvent} | ${database?.statementsPerEvent ?? 'n/a'} ` +
      `| ${server.cpuUsPerEvent} | ${database?.execUsPerEvent ?? 'n/a'} | ${effect.double} / ${effect.missing} |`
    );
  });
  return [
    '| variant | events/s | vs none | p50 ms | p99 ms | max ms | errors | statements/event | round trips/event | DB statements/event | server CPU µs/event | DB exec µs/event | double / missing effects |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...rows,
  ];
}

function baselineReps(result: AdapterResult, info: BaselineInfo): string[] {
  const lines = [
    `### Against ${baselineName(info)}: every repetition`,
    '',
    '| pair | rep | events/s in the order run | current lib/raw | baseline lib/raw | lib current/baseline | raw current/baseline | errors |',
    '|---|---:|---|---:|---:|---:|---:|---:|',
  ];
  for (const [pair, ratios] of Object.entries(result.baseline!)) {
    ratios.reps.forEach((rep, index) => {
      const order = rep.sides
        .map((side) => `${side.side} ${side.variant} ${side.eventsPerSecond}`)
        .join(' → ');
      const errors = rep.sides.reduce((sum, side) => sum + side.errors, 0);
      lines.push(
        `| ${pair} | ${index + 1} | ${order} | ${rep.current.toFixed(3)} | ${rep.baseline.toFixed(3)} | ` +
          `${rep.direct.toFixed(3)} | ${rep.directRaw.toFixed(3)} | ${errors} |`,
      );
    });
  }
  lines.push('');
  if (result.baselineServerLog && result.baselineServerLog.lines > 0) {
    lines.push(
      `Baseline server log: ${result.baselineServerLog.lines} lines (errors/warnings); last ones:`,
      '',
      '```',
    );
    lines.push(...result.baselineServerLog.tail.slice(-10), '```', '');
  }
  return lines;
}

function adapterSection(result: AdapterResult, info: BaselineInfo | undefined): string[] {
  const lines: string[] = [`## ${result.adapter}`, '', `${result.startedAt} → ${result.finishedAt}`, ''];
  lines.push('### Throughput ratios, interleaved (the first two are the headline)', '');
  lines.push(
    '| pair | median | min | max | repetitions (events/s, left/right) |',
    '|---|---:|---:|---:|---|',
  );
  for (const [pair, ratio] of Object.entries(result.ratios)) {
    const reps = ratio.reps.map((rep) => `${rep.libEventsPerSecond}/${rep.rawEventsPerSecond}`).join(', ');
    lines.push(
      `| ${pair} | **${ratio.median.toFixed(3)}** | ${ratio.min.toFixed(3)} | ${ratio.max.toFixed(3)} | ${reps} |`,
    );
  }
  lines.push('');
  if (info && result.baseline) lines.push(...baselineReps(result, info));
  for (const [pair, path] of Object.entries(result.happyPath)) {
    lines.push(
      `Happy path, ${pair}: ${path.lib} round trips vs ${path.raw} — ` +
        (path.extra > 0 ? `**the library adds ${path.extra}**.` : 'the library adds none.'),
    );
  }
  lines.push('');
  for (const workload of WORKLOADS) {
    lines.push(
      `### ${workload === 'unique' ? 'All keys unique' : '30% duplicates (of events already answered)'}`,
      '',
    );
    lines.push(...cellsTable(result, workload), '');
  }
  lines.push('### What each variant sends (one new event, then the same event again)', '');
  lines.push('| variant | new event | answer | duplicate | answer |', '|---|---|---|---|---|');
  for (const variant of VARIANTS) {
    const { first, duplicate } = result.traces[variant];
    const steps = (queries: TracedQuery[]) => queries.map(label).join(' → ');
    lines.push(
      `| ${variant} | ${first.queries.length}: ${steps(first.queries)} | ${first.status} | ` +
        `${duplicate.queries.length}: ${steps(duplicate.queries)} | ${duplicate.status} |`,
    );
  }
  lines.push('');
  if (result.storm.length) {
    lines.push('### Duplicate storm', '');
    lines.push(
      '| variant | claim held | unrelated p99 calm | unrelated p99 storm | ratio | unrelated max storm | duplicates answered | duplicate latency p50 / max | peak lock waiters | peak pool queue | orders for the key |',
      '|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|',
    );
    for (const storm of result.storm) {
      lines.push(
        `| ${storm.variant} | ${storm.holdMs} ms | ${storm.unrelatedCalm.p99} ms | ${storm.unrelatedStorm.p99} ms | ` +
          `${storm.p99Ratio}× | ${storm.unrelatedStorm.max} ms | ${statusCell(storm.duplicates.answers)} | ` +
          `${storm.duplicates.latencyMs.p50} / ${storm.duplicates.latencyMs.max} ms | ${storm.peak.lockWaiters} | ` +
          `${storm.peak.poolWaiting} | ${storm.effect.orders} |`,
      );
    }
    lines.push('');
  }
  const libTx = result.cpu?.['lib-tx'];
  const rawTx = result.cpu?.['raw-tx'];
  if (libTx && rawTx) {
    lines.push('### Where the time goes (CPU profile of the server, self time)', '');
    lines.push(
      `lib-tx: ${libTx.cpuUsPerEvent} µs of main-thread CPU per event against ${rawTx.cpuUsPerEvent} µs for raw-tx. ` +
        `Frames in the library's own code (dist/lib): **${libTx.libraryUsPerEvent} µs per event, ${pct(libTx.libraryShare)}** ` +
        `of lib-tx's CPU; with everything they call synchronously, ${libTx.libraryInclusiveUsPerEvent} µs (${pct(libTx.libraryInclusiveShare)}).`,
      '',
    );
    const groups = [...new Set([...libTx.groups, ...rawTx.groups].map((group) => group.group))];
    lines.push('| code | lib-tx µs/event | raw-tx µs/event |', '|---|---:|---:|');
    for (const group of groups) {
      const of = (attribution: typeof libTx) =>
        attribution.groups.find((entry) => entry.group === group)?.usPerEvent ?? 0;
      lines.push(`| ${group} | ${of(libTx)} | ${of(rawTx)} |`);
    }
    lines.push('', 'Costliest library functions (lib-tx, self time):', '');
    for (const fn of libTx.topLibraryFunctions) lines.push(`- ${fn.usPerEvent} µs/event: \`${fn.name}\``);
    lines.push('');
  }
  if (result.serverLog.lines > 0) {
    lines.push(`Server log: ${result.serverLog.lines} lines (errors/warnings); last ones:`, '', '```');
    lines.push(...result.serverLog.tail.slice(-10), '```', '');
  }
  return lines;
}

/** The Markdown report of a run. */
export function renderMarkdown(run: BenchRun): string {
  const { options, environment } = run;
  const lines = [
    `# Benchmark results (${run.mode} run)`,
    '',
    `${Object.entries(environment)
      .map(([name, value]) => `${name}: ${value}`)
      .join(' · ')}`,
    '',
    `autocannon, ${options.connections} keep-alive connections, ~1 KB Stripe-shaped events, pg pool ${options.poolSize}; ` +
      `${options.cellS} s per cell, ${options.reps} interleaved repetitions of ${options.ratioS} s per side for the ratios; ` +
      `storm: claim held ${options.storm.holdMs} ms, ${options.storm.duplicates} concurrent duplicates, ` +
      `unrelated events at ${options.storm.rate}/s open loop over ${options.storm.windowMs} ms` +
      (options.duplicateWaitMs === undefined
        ? ''
        : `; concurrentDuplicateWaitMs ${options.duplicateWaitMs}`) +
      '.',
    '',
    '| variant | what the handler does |',
    '|---|---|',
    ...VARIANTS.map((variant) => `| ${variant} | ${VARIANT_DESCRIPTIONS[variant]} |`),
    '',
  ];
  if (run.baseline) lines.push(baselineLine(run.baseline), '', ...baselineTable(run), '');
  for (const result of run.adapters) lines.push(...adapterSection(result, run.baseline));
  return lines.join('\n');
}

/** The short version for bench/README.md: headline, unique-key table, storm and CPU, all adapters. */
export function renderReadmeSummary(run: BenchRun, file: string): string {
  const { options } = run;
  const lines = [
    `${run.adapters[0]?.startedAt.slice(0, 10)}, ${run.environment.cpu}, Node ${run.environment.node}, ` +
      `${run.environment.database}; ${options.connections} connections, pool ${options.poolSize}, ` +
      `${options.cellS} s per cell, ${options.reps} interleaved repetitions of ${options.ratioS} s. ` +
      `Every table of the run: [${file}](${file}).`,
    '',
    '| adapter | lib-tx / raw-tx | lib-external / raw-lease | round trips added on the happy path | reference: raw-tx-intercepted / raw-tx | lib-tx / raw-tx-intercepted |',
    '|---|---:|---:|---|---:|---:|',
  ];
  for (const result of run.adapters) {
    const ratio = (name: string) => {
      const measured = result.ratios[name];
      if (!measured) return 'n/a';
      return `**${measured.median.toFixed(3)}** (${measured.min.toFixed(3)}–${measured.max.toFixed(3)})`;
    };
    const added = Object.values(result.happyPath)
      .map((path) => `${path.extra} (${path.lib} vs ${path.raw})`)
      .join(', ');
    lines.push(
      `| ${result.adapter} | ${ratio('lib-tx/raw-tx')} | ${ratio('lib-external/raw-lease')} | ${added} | ` +
        `${ratio('raw-tx-intercepted/raw-tx')} | ${ratio('lib-tx/raw-tx-intercepted')} |`,
    );
  }
  if (run.baseline) lines.push('', ...baselineTable(run));
  lines.push(
    '',
    'All keys unique:',
    '',
    '| adapter | variant | events/s | p50 ms | p99 ms | max ms | errors | statements/event | round trips/event | DB statements/event | server CPU µs/event |',
    '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  );
  for (const result of run.adapters) {
    for (const cell of result.cells.filter((entry) => entry.workload === 'unique')) {
      const { load, server, database } = cell;
      lines.push(
        `| ${result.adapter} | ${cell.variant} | ${load.eventsPerSecond} | ${load.latencyMs.p50} | ${load.latencyMs.p99} | ` +
          `${load.latencyMs.max} | ${load.non2xx + load.errors} | ${server.statementsPerEvent} | ` +
          `${server.roundTripsPerEvent} | ${database?.statementsPerEvent ?? 'n/a'} | ${server.cpuUsPerEvent} |`,
      );
    }
  }
  lines.push(
    '',
    `Duplicate storm (claim held ${options.storm.holdMs} ms, ${options.storm.duplicates} duplicates, unrelated events at ${options.storm.rate}/s):`,
    '',
    '| adapter | variant | unrelated p99 calm | unrelated p99 storm | duplicates answered | peak pool queue |',
    '|---|---|---:|---:|---|---:|',
  );
  for (const result of run.adapters) {
    for (const storm of result.storm) {
      lines.push(
        `| ${result.adapter} | ${storm.variant} | ${storm.unrelatedCalm.p99} ms | ${storm.unrelatedStorm.p99} ms ` +
          `(${storm.p99Ratio}×) | ${statusCell(storm.duplicates.answers)} | ${storm.peak.poolWaiting} |`,
      );
    }
  }
  const profiled = run.adapters.filter((result) => result.cpu?.['lib-tx'] && result.cpu['raw-tx']);
  if (profiled.length) {
    lines.push(
      '',
      'CPU profile (main thread, self time):',
      '',
      '| adapter | lib-tx µs/event | raw-tx µs/event | library code (dist/lib) | library code and what it calls synchronously | rxjs | @nestjs/\\* | typeorm |',
      '|---|---:|---:|---:|---:|---:|---:|---:|',
    );
    for (const result of profiled) {
      const lib = result.cpu!['lib-tx']!;
      const raw = result.cpu!['raw-tx']!;
      const group = (name: string) => lib.groups.find((entry) => entry.group === name)?.usPerEvent ?? 0;
      const rawGroup = (name: string) => raw.groups.find((entry) => entry.group === name)?.usPerEvent ?? 0;
      lines.push(
        `| ${result.adapter} | ${lib.cpuUsPerEvent} | ${raw.cpuUsPerEvent} | ${lib.libraryUsPerEvent} µs (${pct(lib.libraryShare)}) | ` +
          `${lib.libraryInclusiveUsPerEvent} µs (${pct(lib.libraryInclusiveShare)}) | ${group('rxjs')} | ` +
          `${group('@nestjs/*')} (raw-tx ${rawGroup('@nestjs/*')}) | ${group('typeorm')} |`,
      );
    }
  }
  return lines.join('\n');
}
