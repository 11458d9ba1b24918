import type { HttpAdapterHost } from '@nestjs/core';
import { processWide } from '../core/process-wide.js';

/**
 * Whether the app was created with `rawBody: true`, learned from Nest's HTTP adapter.
 *
 * Why this reaches into the adapter: Nest keeps the application options (`rawBody`, `bodyParser`)
 * private to NestApplication, and nothing public tells a module whether raw bodies will be kept.
 * Without knowing, a missing `rawBody: true` would only show at the first delivery, as a refused
 * signature (the worst kind of misconfiguration: the sender retries, then disables the endpoint).
 * What Nest does expose is the adapter, through HttpAdapterHost, and the flag it passes to it:
 * `NestApplication.init()` calls `adapter.registerParserMiddleware(prefix, rawBody)` (and
 * `app.useBodyParser()` calls `adapter.useBodyParser(type, rawBody, ...)`) before any
 * `onModuleInit` hook runs. So this file wraps those two methods on the adapter instance, once,
 * to record the flag; each wrapper calls the original with the same arguments.
 *
 * `init$` is a ReplaySubject that emits once the adapter is set, both for `NestFactory.create`
 * and for `Test.createTestingModule(...).createNestApplication()`, whether that happens before or
 * after the subscribing provider is created. With `bodyParser: false` Nest calls neither method:
 * the setting stays `unknown`, the boot check is skipped, and a request without `rawBody` is
 * answered 500 by the guard. This is the only file that touches the adapter this way.
 */

/** What was recorded for one adapter: whether Nest called a parser method, and with `rawBody: true`. */
interface RawBodyRecord {
  parserRegistered: boolean;
  rawBody: boolean;
}

/**
 * `enabled`: Nest registered its body parsers with `rawBody: true`. `disabled`: it registered them
 * without. `unknown`: no body parser was registered (`bodyParser: false`), or no HTTP adapter.
 */
export type RawBodySetting = 'enabled' | 'disabled' | 'unknown';

/**
 * Per adapter instance, so several apps in one process (tests) never mix their settings; shared
 * by both builds of the library (see processWide), so an adapter is wrapped once.
 */
const records = processWide('raw-body-records', () => new WeakMap<object, RawBodyRecord>());

/** The adapter methods that receive the `rawBody` flag as their second argument. */
const PARSER_METHODS = ['registerParserMiddleware', 'useBodyParser'] as const;

/** Starts recording the `rawBody` flag of the app whose adapter `host` holds (now or later). */
export function watchRawBody(host: HttpAdapterHost): void {
  // Nest 11 releases without init$ set the adapter before any provider is created.
  const init$ = (host as { init$?: HttpAdapterHost['init$'] }).init$;
  if (init$) init$.subscribe(() => instrument(host.httpAdapter));
  else instrument(host.httpAdapter);
}

/** The recorded setting of `adapter` (HttpAdapterHost.httpAdapter). */
export function rawBodySetting(adapter: object | undefined): RawBodySetting {
  const record = adapter ? records.get(adapter) : undefined;
  if (!record?.parserRegistered) return 'unknown';
  return record.rawBody ? 'enabled' : 'disabled';
}

function instrument(adapter: object | undefined): void {
  if (!adapter || records.has(adapter)) return;
  const record: RawBodyRecord = { parserRegistered: false, rawBody: false };
  records.set(adapter, record);
  const methods = adapter as Record<string, unknown>;
  for (const name of PARSER_METHODS) {
    const original = methods[name];
    if (typeof original !== 'function') continue;
    methods[name] = function (this: unknown, ...args: unknown[]) {
      record.parserRegistered = true;
      if (args[1] === true) record.rawBody = true;
      return (original as (...args: unknown[]) => unknown).apply(this, args);
    };
  }
}
