import { skippedLine } from '../baseline-pairs.js';
import { round, spread } from '../load/percentiles.js';
import type { TracedQuery } from '../server/query-counter.js';
import { VARIANT_DESCRIPTIONS, VARIANTS, WORKLOADS, type Workload } from '../variants.js';
import type {
  AdapterResult,
  BaselineInfo,
  BenchRun,
  CellResult,
  NetworkPathsResult,
  Spread,
  Trace,
} from './bench-result.js';

/** From a run's .md in bench/results/ to its profiles, which the bench writes to bench/profiles/. */
const PROFILES_LINK = '../profiles/';
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
  // A run saved before `skipped` existed has none.
  const skipped = skippedLine(baselineName(info), info.skipped ?? []);
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
      : ' Its bench/server is the same code as the current one.') +
    (skipped ? ` Baseline ${skipped}.` : '')
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

/** The pairs of the network-path tables, in column order. */
const PATH_COLUMNS = [
  ['lib-tx/raw-tx', 'unique'],
  ['lib-tx/raw-tx', 'dup30'],
  ['lib-external/raw-lease', 'unique'],
  ['lib-external/raw-lease', 'dup30'],
] as const;

/**
 * The network-path figures of every adapter that has them: lib/raw per path and workload, what
 * `preparedStatements: false` costs, and what each proxy did.
 */
function pathsTables(run: BenchRun): string[] {
  const measured = run.adapters.filter((result) => result.paths);
  if (measured.length === 0) return [];
  const lines = [
    `The headline pairs on loopback and with each direction between the app and PostgreSQL delayed ` +
      `by a proxy (\`--latency-ms\`; the 0 ms proxy is the control), interleaved in the same ` +
      `${run.options.reps} repetitions of ${run.options.ratioS} s per side; lib/raw, median (min–max):`,
    '',
    '| adapter | path | lib-tx / raw-tx | lib-tx / raw-tx, 30% duplicates | lib-external / raw-lease | lib-external / raw-lease, 30% duplicates |',
    '|---|---|---:|---:|---:|---:|',
  ];
  for (const result of measured) {
    for (const path of result.paths!.paths) {
      const cells = PATH_COLUMNS.map(([pair, workload]) => {
        const ratio = result.paths!.ratios.find(
          (entry) => entry.path === path.name && entry.pair === pair && entry.workload === workload,
        );
        return ratio ? spreadCell(ratio) : 'n/a';
      });
      lines.push(`| ${result.adapter} | ${path.name} | ${cells.join(' | ')} |`);
    }
  }
  const costs = measured.filter((result) => result.paths!.prepared.length > 0);
  if (costs.length) {
    lines.push(
      '',
      '`preparedStatements: false` (a second server process per path, `--unprepared`) against the ' +
        "library's default, all keys unique, in the same repetitions. The control is the same " +
        'hand-written route on both servers: its spread is the noise between two processes.',
      '',
      '| adapter | path | lib-tx unprepared / prepared | control: raw-tx | lib-external unprepared / prepared | control: raw-lease | unprepared lib-tx / raw-tx | unprepared lib-external / raw-lease |',
      '|---|---|---:|---:|---:|---:|---:|---:|',
    );
    for (const result of costs) {
      const { prepared, ratios } = result.paths!;
      for (const path of [...new Set(prepared.map((cost) => cost.path))]) {
        const cost = (pair: string) => prepared.find((entry) => entry.path === path && entry.pair === pair);
        const unprepared = (pair: string) =>
          ratios.find((entry) => entry.path === path && entry.pair === pair && entry.workload === 'unique')
            ?.unprepared;
        const cell = (spread: Spread | undefined) => (spread ? spreadCell(spread) : 'n/a');
        lines.push(
          `| ${result.adapter} | ${path} | ${cell(cost('lib-tx/raw-tx')?.lib)} | ${cell(cost('lib-tx/raw-tx')?.control)} | ` +
            `${cell(cost('lib-external/raw-lease')?.lib)} | ${cell(cost('lib-external/raw-lease')?.control)} | ` +
            `${cell(unprepared('lib-tx/raw-tx'))} | ${cell(unprepared('lib-external/raw-lease'))} |`,
        );
      }
    }
  }
  const proxied = measured.filter((result) => result.paths!.proxies.length > 0);
  if (proxied.length) {
    lines.push(
      '',
      'The proxies over the whole comparison (delay-proxy.c, one process each): the CPU they took from ' +
        "the same cores, and how long chunks really waited (the clock's lateness included):",
      '',
      '| adapter | proxy | chunks | CPU µs per chunk | waited mean / p50 / p99 / max ms |',
      '|---|---|---:|---:|---|',
    );
    for (const result of proxied) {
      for (const { delayMs, stats } of result.paths!.proxies) {
        const chunks = stats.chunksUp + stats.chunksDown;
        const waited = stats.achievedMs
          ? `${stats.achievedMs.mean.toFixed(3)} / ${stats.achievedMs.p50.toFixed(3)} / ` +
            `${stats.achievedMs.p99.toFixed(3)} / ${stats.achievedMs.max.toFixed(2)}`
          : 'passed at once';
        lines.push(
          `| ${result.adapter} | ${delayMs} ms | ${chunks} | ${chunks ? (stats.cpuUs / chunks).toFixed(1) : 'n/a'} | ${waited} |`,
        );
      }
    }
  }
  return lines;
}

/** Every repetition of the network-path comparison, one row per path, server, pair and workload. */
function pathsReps(paths: NetworkPathsResult): string[] {
  const lines = [
    '### Network paths: every repetition',
    '',
    '| path | server | pair | workload | lib/raw median | repetitions (lib/raw events/s) | errors |',
    '|---|---|---|---|---:|---|---:|',
  ];
  const groups = new Map<string, { lib: number[]; raw: number[]; errors: number }>();
  for (const sides of paths.reps) {
    for (const side of sides) {
      const pair =
        side.variant.startsWith('lib-tx') || side.variant === 'raw-tx'
          ? 'lib-tx/raw-tx'
          : 'lib-external/raw-lease';
      const key = [side.path, side.prepared, pair, side.workload].join('|');
      const group = groups.get(key) ?? { lib: [], raw: [], errors: 0 };
      group[side.variant.startsWith('lib-') ? 'lib' : 'raw'].push(side.eventsPerSecond);
      group.errors += side.errors;
      groups.set(key, group);
    }
  }
  for (const [key, group] of groups) {
    const [path, prepared, pair, workload] = key.split('|');
    const ratios = group.lib.map((lib, index) => lib / group.raw[index]);
    lines.push(
      `| ${path} | ${prepared} | ${pair} | ${workload} | ${spread(ratios).median.toFixed(3)} | ` +
        `${group.lib.map((lib, index) => `${lib}/${group.raw[index]}`).join(', ')} | ${group.errors} |`,
    );
  }
  lines.push('');
  if (paths.unpreparedTraces) {
    lines.push(
      'What the `preparedStatements: false` server sends (one new event, then the same event again):',
      '',
      '| variant | new event | answer | duplicate | answer |',
      '|---|---|---|---|---|',
    );
    for (const [variant, traced] of Object.entries(paths.unpreparedTraces)) {
      lines.push(traceRow(variant, traced));
    }
    lines.push('');
  }
  for (const log of paths.serverLogs.filter((entry) => entry.lines > 0)) {
    lines.push(`Server log (${log.server}): ${log.lines} lines (errors/warnings); last ones:`, '', '```');
    lines.push(...log.tail.slice(-10), '```', '');
  }
  return lines;
}

function traceRow(variant: string, { first, duplicate }: { first: Trace; duplicate: Trace }): string {
  const steps = (queries: TracedQuery[]) => queries.map(label).join(' → ');
  return (
    `| ${variant} | ${first.queries.length}: ${steps(first.queries)} | ${first.status} | ` +
    `${duplicate.queries.length}: ${steps(duplicate.queries)} | ${duplicate.status} |`
  );
}

/** A statement as a short label: `START TRANSACTION`, `INSERT INTO orders`, ... */
function label(query: TracedQuery): string {
  const sql = query.sql;
  if (sql.startsWith('WITH bound')) return 'claim (INSERT … ON CONFLICT, lock_timeout via set_config)';
  if (/^BEGIN; ?WITH bound/.test(sql)) return 'BEGIN; claim with its values inlined (one query)';
  if (sql.startsWith('WITH claim AS')) return 'lease claim (INSERT … DO UPDATE; answers a duplicate itself)';
  const insert = /^INSERT INTO "?(\w+)"?/.exec(sql);
  if (insert)
    return insert[1] === 'orders'
      ? 'insert order'
      : `INSERT INTO ${insert[1]}${sql.includes('DO UPDATE') ? ' … DO UPDATE' : ''}`;
  const update = /^UPDATE "?processed_events"? SET status = '(\w+)'/.exec(sql);
  if (update) return `UPDATE → ${update[1]}`;
  if (sql.startsWith('SELECT status')) return 'SELECT status';
  return sql.length > 40 ? `${sql.slice(0, 37)}...` : sql;
}

/**
 * Promises and other async resources per delivery, new keys and replays, beside the no-op
 * interceptor's: the counts are deterministic for a build, so a change that adds a promise to
 * the hot path shows here however noisy the throughput is.
 */
function asyncWorkTable(work: NonNullable<AdapterResult['asyncWork']>): string[] {
  const lines = [
    '### Async work per delivery (promises and other async resources, from async hooks)',
    '',
    '| variant | promises, new key | resources, new key | promises, replay | resources, replay | beyond raw-tx-intercepted (new key) |',
    '|---|---:|---:|---:|---:|---:|',
  ];
  const reference = work['raw-tx-intercepted']?.unique.promises;
  for (const variant of VARIANTS) {
    const entry = work[variant];
    if (!entry) continue;
    const beyond = reference === undefined ? '' : `${round(entry.unique.promises - reference, 2)}`;
    lines.push(
      `| ${variant} | ${entry.unique.promises} | ${entry.unique.resources} | ${entry.duplicate.promises} | ` +
        `${entry.duplicate.resources} | ${beyond} |`,
    );
  }
  const libTx = work['lib-tx']?.unique.byType;
  if (libTx) {
    const types = Object.entries(libTx)
      .sort((a, b) => b[1] - a[1])
      .map(([type, count]) => `${type} ${count}`)
      .join(', ');
    lines.push('', `lib-tx, new key, by type: ${types}.`);
  }
  return lines;
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
      `| ${server.cpuUsPerEvent} | ${database?.execUsPerEvent ?? 'n/a'} | ${database?.cpuUsPerEvent ?? 'n/a'} | ${effect.double} / ${effect.missing} |`
    );
  });
  return [
    '| variant | events/s | vs none | p50 ms | p99 ms | max ms | errors | statements/event | round trips/event | DB statements/event | server CPU µs/event | DB exec µs/event | DB server CPU µs/event | double / missing effects |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
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
  if (Object.keys(result.ratios).length > 0) {
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
  }
  if (result.paths) lines.push(...pathsReps(result.paths));
  if (info && result.baseline) lines.push(...baselineReps(result, info));
  for (const [pair, path] of Object.entries(result.happyPath)) {
    lines.push(
      `Happy path, ${pair}: ${path.lib} round trips vs ${path.raw} — ` +
        (path.extra > 0 ? `**the library adds ${path.extra}**.` : 'the library adds none.'),
    );
  }
  lines.push('');
  for (const workload of result.cells.length > 0 ? WORKLOADS : []) {
    lines.push(
      `### ${workload === 'unique' ? 'All keys unique' : '30% duplicates (of events already answered)'}`,
      '',
    );
    lines.push(...cellsTable(result, workload), '');
  }
  lines.push('### What each variant sends (one new event, then the same event again)', '');
  lines.push('| variant | new event | answer | duplicate | answer |', '|---|---|---|---|---|');
  for (const variant of VARIANTS) lines.push(traceRow(variant, result.traces[variant]));
  lines.push('');
  if (result.asyncWork) lines.push(...asyncWorkTable(result.asyncWork), '');
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
  if (result.cpu) {
    lines.push('Every variant under the same load (main-thread CPU per event, from its profile):', '');
    lines.push('| variant | CPU µs/event | library µs/event | profile |', '|---|---:|---:|---|');
    for (const variant of VARIANTS) {
      const attribution = result.cpu[variant];
      const file = result.cpu.profiles[variant]?.split('/').pop();
      if (!attribution || !file) continue;
      lines.push(
        `| ${variant} | ${attribution.cpuUsPerEvent} | ${attribution.libraryUsPerEvent} | [${file}](${PROFILES_LINK}${file}) |`,
      );
    }
    const graphs = Object.entries(result.cpu.flameGraphs);
    if (graphs.length) {
      lines.push(
        '',
        'Flame graphs: ' +
          graphs
            .map(([variant, path]) => `[${variant}](${PROFILES_LINK}${path.split('/').pop()})`)
            .join(', ') +
          ' (bench/profiles/ is not committed: the files are on the machine that ran the bench).',
      );
    }
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
  const paths = pathsTables(run);
  if (paths.length) lines.push('## Network paths', '', ...paths, '');
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

/** The network-path tables for bench/README.md (`--latency-ms`, `--unprepared`), all adapters. */
export function renderPathsSummary(run: BenchRun, file: string): string {
  return [
    `${run.adapters[0]?.startedAt.slice(0, 10)}, ${run.environment.cpu}, Node ${run.environment.node}, ` +
      `${run.environment.database}, load average ${run.environment['load average at start']} at the start; ` +
      `${run.options.connections} connections, pool ${run.options.poolSize}. ` +
      `Every repetition: [${file}](${file}).`,
    '',
    ...pathsTables(run),
  ].join('\n');
}
