/** The module's `telemetry` option: spans and metrics beyond the outcome counters. */
export interface TelemetryOptions {
  /**
   * A span per delivery, the handoff's trace context, and the metrics on an OpenTelemetry meter,
   * through `@opentelemetry/api` (an optional peer) when the app has it installed; `false` never
   * loads it.
   * @default true (used only when @opentelemetry/api is installed)
   */
  openTelemetry?: boolean;
  /**
   * Upper bounds of the claim and handler duration histograms' buckets, in seconds, ascending
   * (prom-client's `buckets`, OpenTelemetry's `explicitBucketBoundaries`).
   * @default [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
   */
  durationBuckets?: number[];
}

/** The `telemetry` option with its defaults. */
export interface TelemetryConfig {
  openTelemetry: boolean;
  durationBuckets: number[];
}

/** The default duration buckets: a claim takes about a millisecond, a slow handler seconds. */
export const DEFAULT_DURATION_BUCKETS = [
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
];

const KNOWN = ['openTelemetry', 'durationBuckets'];

const badTelemetryOption = (name: string, expected: string, value: unknown) =>
  `IdempotencyModule option telemetry.${name} must be ${expected}, got ${JSON.stringify(value) ?? String(value)}`;

/** The `telemetry` option checked (a mistake fails the boot) and with its defaults. */
export function resolveTelemetryOptions(options: TelemetryOptions | undefined): TelemetryConfig {
  if (options !== undefined && (typeof options !== 'object' || options === null || Array.isArray(options))) {
    throw new Error(
      `IdempotencyModule option telemetry must be an object ({ openTelemetry, durationBuckets }), got ${String(options)}`,
    );
  }
  for (const name of Object.keys(options ?? {})) {
    if (!KNOWN.includes(name)) {
      throw new Error(`IdempotencyModule option telemetry.${name} is unknown (known: ${KNOWN.join(', ')})`);
    }
  }
  const { openTelemetry = true, durationBuckets = DEFAULT_DURATION_BUCKETS } = options ?? {};
  if (typeof openTelemetry !== 'boolean') {
    throw new Error(badTelemetryOption('openTelemetry', 'true or false', openTelemetry));
  }
  const ascending =
    Array.isArray(durationBuckets) &&
    durationBuckets.length > 0 &&
    durationBuckets.every(
      (bound, index) =>
        typeof bound === 'number' &&
        Number.isFinite(bound) &&
        bound > 0 &&
        (index === 0 || bound > durationBuckets[index - 1]!),
    );
  if (!ascending) {
    throw new Error(
      badTelemetryOption(
        'durationBuckets',
        'a non-empty array of positive seconds, ascending',
        durationBuckets,
      ),
    );
  }
  return { openTelemetry, durationBuckets: [...durationBuckets] };
}
