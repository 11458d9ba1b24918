/**
 * What ClaimRunner.execute()'s telemetry costs per delivery, without a database: the claim is a
 * resolved promise that runs the work once, so only the wrapping is timed (the spans, the two
 * histograms, their timers). One configuration per process, given as the argument, so that one
 * cannot warm or register anything for another:
 *
 *   off   neither prom-client nor OpenTelemetry (what a delivery pays is the claim runner's check)
 *   prom  prom-client's two histograms, OpenTelemetry off
 *   noop  prom-client and @opentelemetry/api without an SDK: the API's no-op tracer (prom-client's own dependency)
 *   sdk   prom-client and a recording SDK: BasicTracerProvider, SimpleSpanProcessor, in-memory exporter,
 *         Node's AsyncLocalStorage context manager
 *
 * node dist/bench/telemetry-cost.js <mode> [deliveries per round]; prints the median of 5 rounds.
 */
import 'reflect-metadata';
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import type { IdempotentDelivery } from '../lib/core/claim-delivery.js';
import type { ClaimResult } from '../lib/core/claim-result.js';
import { Propagation } from '../lib/core/propagation.js';
import { resolveIdempotencyConfig } from '../lib/idempotency.config.js';
import { IdempotencyMetrics } from '../lib/idempotency.metrics.js';
import { DeliveryTelemetry } from '../lib/observability/delivery-telemetry.js';
import { HandoffMetrics } from '../lib/transports/queue/handoff-metrics.js';

const MODES = ['off', 'prom', 'noop', 'sdk'] as const;
const ROUNDS = 5;

async function main(): Promise<void> {
  const mode = process.argv[2] as (typeof MODES)[number];
  if (!MODES.includes(mode)) throw new Error(`usage: telemetry-cost.js ${MODES.join('|')} [deliveries]`);
  const deliveries = Number(process.argv[3] ?? 50_000);
  const exporter = new InMemorySpanExporter();
  if (mode === 'sdk') {
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
    trace.setGlobalTracerProvider(
      new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }),
    );
  }
  const config = resolveIdempotencyConfig({
    prometheus: mode !== 'off',
    telemetry: { openTelemetry: mode === 'noop' || mode === 'sdk' },
  });
  const metrics = new IdempotencyMetrics(config);
  await metrics.onModuleInit();
  const telemetry = new DeliveryTelemetry(config, metrics, new HandoffMetrics(config));
  await telemetry.onModuleInit();

  const spec = {
    scope: 'Bench.order',
    source: 'bench',
    mode: 'transaction',
    propagation: Propagation.Required,
  };
  const delivery = { key: 'evt', scope: spec.scope, mode: 'transaction' } as IdempotentDelivery;
  const work = async () => 1;
  const claim = async (run: (d: IdempotentDelivery) => Promise<number>): Promise<ClaimResult<number>> => ({
    kind: 'processed',
    value: await run(delivery),
  });
  // What ClaimRunner.execute() does: the check, then the telemetry's wrapping or the claim itself.
  const once = (i: number) =>
    telemetry.enabled ? telemetry.observe(spec, `evt_${i}`, undefined, work, claim) : claim(work);

  for (let i = 0; i < 20_000; i++) await once(i);
  const perDelivery: number[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    // The in-memory exporter keeps every span: emptied between rounds, outside the timing.
    exporter.reset();
    const started = process.hrtime.bigint();
    for (let i = 0; i < deliveries; i++) await once(i);
    perDelivery.push(Number(process.hrtime.bigint() - started) / deliveries / 1000);
  }
  perDelivery.sort((a, b) => a - b);
  const [min, median, max] = [perDelivery[0]!, perDelivery[2]!, perDelivery[ROUNDS - 1]!];
  console.log(
    `${mode}: ${median.toFixed(2)} µs per delivery (min ${min.toFixed(2)}, max ${max.toFixed(2)}; ` +
      `telemetry ${telemetry.enabled ? 'on' : 'off'})`,
  );
}

void main();
