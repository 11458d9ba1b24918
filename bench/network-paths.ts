import { warmRoutes, type LoadFn } from './baseline-comparison.js';
import type { AdapterName, BenchOptions } from './bench-options.js';
import { round, spread } from './load/percentiles.js';
import type {
  NetworkPathsResult,
  PathRatio,
  PathSide,
  PreparedCost,
  PreparedMode,
  Trace,
} from './report/bench-result.js';
import { DelayProxyProcess } from './support/delay-proxy-process.js';
import { ServerProcess } from './support/server-process.js';
import { HEADLINE_PAIRS, WORKLOADS, type Variant, type Workload } from './variants.js';

/** The routes measured on every path: both sides of every headline pair. */
const PATH_VARIANTS: Variant[] = HEADLINE_PAIRS.flatMap((pair) => [pair.lib, pair.raw]);

/** A bench server reached one way, with one prepared-statements setting. */
interface PathServer {
  server: ServerProcess;
  load: LoadFn;
  /** Started for the comparison (and stopped after it), not the adapter's main server. */
  own: boolean;
}

/** One way from the app to PostgreSQL: loopback, or through a delay proxy. */
interface NetworkPath {
  name: string;
  delayMs: number | null;
  proxy?: DelayProxyProcess;
  servers: Partial<Record<PreparedMode, PathServer>>;
}

/** What the comparison needs from the adapter's run. */
export interface NetworkPathsContext {
  options: BenchOptions;
  adapter: AdapterName;
  databaseUrl: string;
  /** The adapter's main server (library defaults, loopback): the prepared side of the loopback path. */
  main: { server: ServerProcess; load: LoadFn };
  loadOn: (url: string) => LoadFn;
  trace: (
    server: ServerProcess,
    variants: Variant[],
  ) => Promise<Partial<Record<Variant, { first: Trace; duplicate: Trace }>>>;
  log: (message: string) => void;
}

/** `proxy 0.5 ms`, or `loopback`. */
function pathName(delayMs: number | null): string {
  return delayMs === null ? 'loopback' : `proxy ${delayMs} ms`;
}

/**
 * The headline pairs on loopback and through a delay proxy per `--latency-ms` delay, plus a 0 ms
 * proxy as the control (a proxy on the same cores costs CPU per round trip, which by itself
 * favours the side with fewer round trips), both workloads; with `--unprepared`, also the library
 * with `preparedStatements: false` in a second server process per path (not on the control: the
 * two settings send the same round trips). Every repetition runs every side of every path, in an
 * order reversed every other repetition, and each ratio is taken within its repetition.
 */
export async function measureNetworkPaths(context: NetworkPathsContext): Promise<NetworkPathsResult> {
  const { options, adapter, databaseUrl, log } = context;
  const paths: NetworkPath[] = [];
  try {
    for (const delayMs of [null, ...(options.latencyMs.length ? [0, ...options.latencyMs] : [])]) {
      const proxy = delayMs === null ? undefined : await DelayProxyProcess.start(databaseUrl, delayMs);
      const path: NetworkPath = { name: pathName(delayMs), delayMs, proxy, servers: {} };
      paths.push(path);
      const url = proxy ? proxy.urlFor(databaseUrl) : databaseUrl;
      path.servers.prepared = proxy
        ? await startServer(context, url, undefined)
        : { ...context.main, own: false };
      if (options.unprepared && delayMs !== 0)
        path.servers.unprepared = await startServer(context, url, false);
    }
    // Every route warmed about as long as the main server's were before their first cell; with
    // --paths-only the main server ran no cells, so it is warmed the same way.
    for (const path of paths) {
      for (const [prepared, side] of Object.entries(path.servers)) {
        if (!side.own && !options.pathsOnly) continue;
        log(`${adapter} paths: warming ${path.name} ${prepared}`);
        const name = (variant: Variant) => `${adapter} ${path.name} ${prepared} /${variant}`;
        await warmRoutes(side.load, PATH_VARIANTS, options.warmS + options.cellS, databaseUrl, name);
      }
    }
    const loopbackUnprepared = paths[0].servers.unprepared;
    const unpreparedTraces = loopbackUnprepared
      ? await context.trace(loopbackUnprepared.server, ['lib-tx', 'lib-external'])
      : undefined;
    for (const path of paths) await path.proxy?.reset();

    const reps: PathSide[][] = [];
    for (let rep = 0; rep < options.reps; rep++) {
      const order = sidesOf(paths);
      if (rep % 2 === 1) order.reverse();
      const sides: PathSide[] = [];
      for (const side of order) {
        const path = paths.find((entry) => entry.name === side.path)!;
        const result = await path.servers[side.prepared]!.load(side.variant, side.workload, options.ratioS);
        sides.push({
          ...side,
          eventsPerSecond: result.eventsPerSecond,
          p50Ms: result.latencyMs.p50,
          errors: result.non2xx + result.errors,
        });
      }
      reps.push(sides);
      log(`${adapter} paths rep ${rep + 1}/${options.reps}: ${describeRep(paths, sides)}`);
    }
    const proxies = [];
    for (const path of paths) {
      if (path.proxy) proxies.push({ delayMs: path.proxy.delayMs, stats: await path.proxy.stats() });
    }
    return {
      paths: paths.map(({ name, delayMs }) => ({ name, delayMs })),
      proxies,
      ratios: pathRatios(paths, reps),
      prepared: preparedCosts(paths, reps),
      ...(unpreparedTraces && { unpreparedTraces }),
      reps,
      serverLogs: paths.flatMap((path) =>
        Object.entries(path.servers)
          .filter(([, side]) => side.own)
          .map(([prepared, side]) => ({
            server: `${path.name} ${prepared}`,
            lines: side.server.log.count,
            tail: side.server.log.lines,
          })),
      ),
    };
  } finally {
    for (const path of paths) {
      for (const side of Object.values(path.servers)) if (side.own) await side.server.stop();
      await path.proxy?.stop();
    }
  }
}

async function startServer(
  context: NetworkPathsContext,
  databaseUrl: string,
  preparedStatements: false | undefined,
): Promise<PathServer> {
  const { options, adapter } = context;
  const server = await ServerProcess.start({
    adapter,
    databaseUrl,
    poolSize: options.poolSize,
    duplicateWaitMs: options.duplicateWaitMs,
    preparedStatements,
  });
  return { server, load: context.loadOn(server.url), own: true };
}

type SideKey = Pick<PathSide, 'path' | 'prepared' | 'variant' | 'workload'>;

/**
 * One repetition's runs in order: per path, pair and workload, lib then raw on the default
 * server, then on the unprepared one (all keys unique only: what preparing costs is the question
 * there, and duplicates send the same statements).
 */
function sidesOf(paths: NetworkPath[]): SideKey[] {
  const sides: SideKey[] = [];
  for (const path of paths) {
    for (const pair of HEADLINE_PAIRS) {
      for (const workload of WORKLOADS) {
        for (const prepared of ['prepared', 'unprepared'] as const) {
          if (!path.servers[prepared] || (prepared === 'unprepared' && workload !== 'unique')) continue;
          for (const variant of [pair.lib, pair.raw])
            sides.push({ path: path.name, prepared, variant, workload });
        }
      }
    }
  }
  return sides;
}

function rate(sides: PathSide[], key: SideKey): number {
  return sides.find(
    (side) =>
      side.path === key.path &&
      side.prepared === key.prepared &&
      side.variant === key.variant &&
      side.workload === key.workload,
  )!.eventsPerSecond;
}

function pathRatios(paths: NetworkPath[], reps: PathSide[][]): PathRatio[] {
  const ratios: PathRatio[] = [];
  for (const path of paths) {
    for (const pair of HEADLINE_PAIRS) {
      for (const workload of WORKLOADS) {
        const of = (prepared: PreparedMode) =>
          spread(
            reps.map(
              (sides) =>
                rate(sides, { path: path.name, prepared, variant: pair.lib, workload }) /
                rate(sides, { path: path.name, prepared, variant: pair.raw, workload }),
            ),
          );
        ratios.push({
          path: path.name,
          delayMs: path.delayMs,
          pair: pair.name,
          workload,
          ...of('prepared'),
          ...(path.servers.unprepared && workload === 'unique' && { unprepared: of('unprepared') }),
        });
      }
    }
  }
  return ratios;
}

function preparedCosts(paths: NetworkPath[], reps: PathSide[][]): PreparedCost[] {
  const costs: PreparedCost[] = [];
  for (const path of paths.filter((entry) => entry.servers.unprepared)) {
    for (const pair of HEADLINE_PAIRS) {
      const across = (variant: Variant) =>
        spread(
          reps.map((sides) => {
            const key = { path: path.name, variant, workload: 'unique' as Workload };
            return (
              rate(sides, { ...key, prepared: 'unprepared' }) / rate(sides, { ...key, prepared: 'prepared' })
            );
          }),
        );
      costs.push({
        path: path.name,
        delayMs: path.delayMs,
        pair: pair.name,
        lib: across(pair.lib),
        control: across(pair.raw),
      });
    }
  }
  return costs;
}

/** One repetition's lib/raw ratios, for the log. */
function describeRep(paths: NetworkPath[], sides: PathSide[]): string {
  return paths
    .map((path) => {
      const ratios = HEADLINE_PAIRS.flatMap((pair) =>
        WORKLOADS.map((workload) => {
          const key = { path: path.name, prepared: 'prepared' as const, workload };
          const ratio =
            rate(sides, { ...key, variant: pair.lib }) / rate(sides, { ...key, variant: pair.raw });
          return `${pair.lib}/${pair.raw} ${workload} ${round(ratio, 3)}`;
        }),
      );
      if (path.servers.unprepared) {
        for (const pair of HEADLINE_PAIRS) {
          const key = { path: path.name, variant: pair.lib, workload: 'unique' as Workload };
          const cost =
            rate(sides, { ...key, prepared: 'unprepared' }) / rate(sides, { ...key, prepared: 'prepared' });
          ratios.push(`${pair.lib} unprepared/prepared ${round(cost, 3)}`);
        }
      }
      return `${path.name}: ${ratios.join(', ')}`;
    })
    .join('; ');
}
