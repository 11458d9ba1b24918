import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { freePort } from './postgres-server.js';
import { PROMETHEUS, requireProgram } from './system-packages.js';
import { waitUntil } from './wait-until.js';

/** How long Prometheus may take to start (its TSDB in a fresh directory). */
const READY_MS = 30_000;

/** One answer of Prometheus's HTTP API. */
interface ApiAnswer<T> {
  status: 'success' | 'error';
  data: T;
  error?: string;
}

/** An alert as /api/v1/alerts lists it. */
export interface PrometheusAlert {
  labels: Record<string, string>;
  annotations: Record<string, string>;
  state: 'pending' | 'firing';
  value: string;
}

/** A real Prometheus server on 127.0.0.1, scraping one target. */
export interface PrometheusServer {
  url: string;
  /** Everything it logged. */
  output(): string;
  /** Runs an instant query. */
  query(
    expr: string,
  ): Promise<
    ApiAnswer<{ resultType: string; result: { metric: Record<string, string>; value: [number, string] }[] }>
  >;
  /** The alerts pending or firing now. */
  alerts(): Promise<PrometheusAlert[]>;
  /** SIGTERM, and waits for it to exit (SIGKILL after 10 s); removes its directory. */
  stop(): Promise<void>;
}

/**
 * Starts Debian's prometheus with a config written to a temporary directory: `target`
 * (host:port on 127.0.0.1) scraped every second at `metricsPath`, and `ruleFiles` evaluated every
 * second, so a test sees an alert fire within seconds of its cause. Its TSDB lives in that
 * directory and goes with it.
 */
export async function startPrometheus(options: {
  target: string;
  metricsPath?: string;
  ruleFiles: string[];
}): Promise<PrometheusServer> {
  const binary = requireProgram(PROMETHEUS);
  const dir = await mkdtemp(join(tmpdir(), 'prometheus-'));
  const port = await freePort();
  const config = [
    'global:',
    '  scrape_interval: 1s',
    '  evaluation_interval: 1s',
    'rule_files:',
    ...options.ruleFiles.map((file) => `  - ${JSON.stringify(resolve(file))}`),
    'scrape_configs:',
    '  - job_name: sample',
    `    metrics_path: ${JSON.stringify(options.metricsPath ?? '/metrics')}`,
    '    static_configs:',
    `      - targets: [${JSON.stringify(options.target)}]`,
    '',
  ].join('\n');
  await writeFile(join(dir, 'prometheus.yml'), config);
  const child = spawn(
    binary,
    [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--log.level=warn',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  let exited = false;
  const exit = new Promise<void>((done) =>
    child.once('exit', () => {
      exited = true;
      done();
    }),
  );
  const url = `http://127.0.0.1:${port}`;
  const get = async <T>(path: string): Promise<ApiAnswer<T>> => {
    const response = await fetch(`${url}${path}`, { signal: AbortSignal.timeout(5_000) });
    return (await response.json()) as ApiAnswer<T>;
  };
  const stop = async () => {
    if (!exited) {
      child.kill('SIGTERM');
      const killer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exit;
      clearTimeout(killer);
    }
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await waitUntil(
      async () => {
        if (exited) throw new Error(`prometheus exited before it was ready:\n${output}`);
        const ready = await fetch(`${url}/-/ready`, { signal: AbortSignal.timeout(2_000) }).catch(
          () => undefined,
        );
        return ready?.status === 200;
      },
      'prometheus to be ready',
      READY_MS,
      100,
    );
  } catch (error) {
    await stop();
    throw error;
  }
  return {
    url,
    output: () => output,
    query: (expr) => get(`/api/v1/query?query=${encodeURIComponent(expr)}`),
    alerts: async () => (await get<{ alerts: PrometheusAlert[] }>('/api/v1/alerts')).data.alerts,
    stop,
  };
}
