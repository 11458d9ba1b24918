import { execFileSync } from 'node:child_process';
import { describe, expect, it } from '@jest/globals';

/**
 * DeliveryTelemetry in a plain Node child process (the CommonJS build), with the optional peers
 * it may use made unresolvable, as in an app that did not install them: with neither, the claim
 * runner's check finds it disabled and a delivery goes the path it went before.
 */
function telemetryWithout(missing: string[]): { enabled: boolean; tracing: boolean } {
  const script = `
    const Module = require('node:module');
    const missing = new Set(${JSON.stringify(missing)});
    const resolve = Module._resolveFilename;
    Module._resolveFilename = function (request, ...rest) {
      if (missing.has(request)) {
        const error = new Error("Cannot find module '" + request + "'");
        error.code = 'MODULE_NOT_FOUND';
        throw error;
      }
      return resolve.call(this, request, ...rest);
    };
    require('reflect-metadata');
    const { resolveIdempotencyConfig } = require('./dist/cjs/idempotency.config.js');
    const { IdempotencyMetrics } = require('./dist/cjs/idempotency.metrics.js');
    const { HandoffMetrics } = require('./dist/cjs/transports/queue/handoff-metrics.js');
    const { DeliveryTelemetry } = require('./dist/cjs/observability/delivery-telemetry.js');
    (async () => {
      const config = resolveIdempotencyConfig({});
      const metrics = new IdempotencyMetrics(config);
      const telemetry = new DeliveryTelemetry(config, metrics, new HandoffMetrics(config));
      await telemetry.onModuleInit();
      console.log(JSON.stringify({ enabled: telemetry.enabled, tracing: metrics.outcomeListener !== undefined }));
    })();
  `;
  return JSON.parse(
    execFileSync(process.execPath, ['-e', script], {
      encoding: 'utf8',
      env: { ...process.env, NODE_OPTIONS: '' },
    }),
  );
}

describe('telemetry without its optional peers', () => {
  it('is off with neither prom-client nor @opentelemetry/api: a delivery pays one check', () => {
    expect(telemetryWithout(['prom-client', '@opentelemetry/api'])).toEqual({
      enabled: false,
      tracing: false,
    });
  });

  // prom-client 15 depends on @opentelemetry/api (for exemplars): an app with prom-client has it,
  // and without an SDK its tracer is the API's no-op one, whose spans the library drops at once.
  it('traces with @opentelemetry/api alone', () => {
    expect(telemetryWithout(['prom-client'])).toEqual({ enabled: true, tracing: true });
  });
});
