import { readFileSync } from 'node:fs';

/** The alert rules the package ships (package.json "files": observability/). */
export const RULES_FILE = 'observability/prometheus/idempotency-alerts.rules.yml';
/** The Grafana dashboard the package ships. */
export const DASHBOARD_FILE = 'observability/grafana/idempotency-dashboard.json';

/** Every query of the dashboard, with its panel's title. */
export function dashboardExpressions(): { panel: string; expr: string }[] {
  const dashboard = JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8')) as {
    panels: { title: string; targets?: { expr: string }[] }[];
  };
  return dashboard.panels.flatMap((panel) =>
    (panel.targets ?? []).map((target) => ({ panel: panel.title, expr: target.expr })),
  );
}

/**
 * A dashboard query as Grafana sends it with every scope selected over a one-minute range: the
 * template variables replaced by what Grafana puts there.
 */
export function asGrafanaSends(expr: string): string {
  return expr.replaceAll('$scope', '.*').replaceAll('$__rate_interval', '1m');
}
