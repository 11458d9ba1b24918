import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from '@jest/globals';
import { METRICS } from '../../lib/observability/telemetry-names.js';
import { DASHBOARD_FILE, dashboardExpressions, RULES_FILE } from '../support/observability-files.js';
import { PROMTOOL, requireProgram } from '../support/system-packages.js';

/** Every series name the library exports, a histogram's three included. */
const KNOWN_SERIES = new Set(
  Object.values(METRICS).flatMap(({ prometheus }) =>
    prometheus.endsWith('_seconds') && prometheus.includes('duration')
      ? [`${prometheus}_bucket`, `${prometheus}_sum`, `${prometheus}_count`]
      : [prometheus],
  ),
);

/** The idempotency_* series an expression reads. */
const seriesIn = (expr: string) => [...expr.matchAll(/\bidempotency_[a-z_]+/g)].map((match) => match[0]);

function promtool(...args: string[]) {
  const run = spawnSync(requireProgram(PROMTOOL), args, { encoding: 'utf8', timeout: 60_000 });
  return { status: run.status, output: `${run.stdout}${run.stderr}` };
}

describe('the shipped Prometheus alert rules', () => {
  it('are valid rules (promtool check rules)', () => {
    const { status, output } = promtool('check', 'rules', RULES_FILE);
    expect(output).toContain('SUCCESS: 6 rules found');
    expect(status).toBe(0);
  });

  it('fire on the series that should raise them, after their `for`, and only then (promtool test rules)', () => {
    const { status, output } = promtool('test', 'rules', 'test/prometheus/idempotency-alerts.test.yml');
    expect(output).toContain('SUCCESS');
    expect(status).toBe(0);
  });

  it('read only metrics the library exports', () => {
    const rules = readFileSync(RULES_FILE, 'utf8');
    const exprs = [...rules.matchAll(/expr: (?:>-\n)?([\s\S]*?)\n\s+(?:for|labels):/g)].map((m) => m[1]!);
    expect(exprs).toHaveLength(6);
    for (const expr of exprs) {
      expect(seriesIn(expr).length).toBeGreaterThan(0);
      for (const series of seriesIn(expr)) expect(KNOWN_SERIES).toContain(series);
    }
  });
});

describe('the shipped Grafana dashboard', () => {
  it('asks for its Prometheus data source on import, and every query reads metrics the library exports', () => {
    const dashboard = JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8'));
    expect(dashboard.__inputs).toEqual([
      expect.objectContaining({ type: 'datasource', pluginId: 'prometheus' }),
    ]);
    const expressions = dashboardExpressions();
    expect(expressions.length).toBeGreaterThanOrEqual(12);
    for (const { expr } of expressions) {
      for (const series of seriesIn(expr)) expect(KNOWN_SERIES).toContain(series);
    }
    // The rules' metrics all have a panel.
    const charted = new Set(expressions.flatMap(({ expr }) => seriesIn(expr)));
    for (const series of [
      'idempotency_poison_events',
      'idempotency_expired_leases',
      'idempotency_claims_total',
      'idempotency_queue_oldest_waiting_seconds',
      'idempotency_claim_duration_seconds_count',
      'idempotency_handler_duration_seconds_bucket',
    ]) {
      expect(charted).toContain(series);
    }
  });
});
