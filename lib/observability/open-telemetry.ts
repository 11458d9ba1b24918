import type * as OpenTelemetryApi from '@opentelemetry/api';
import { loadOptionalPeer } from '../core/optional-peer.js';

/** The `@opentelemetry/api` module, an optional peer: only its types are imported statically. */
export type OpenTelemetry = typeof OpenTelemetryApi;

/** The name the library's tracer and meter are registered under. */
export const INSTRUMENTATION_NAME = 'nest-idempotent-webhooks';

/**
 * `@opentelemetry/api` when the app has it installed, else undefined (then no span is made and
 * no instrument created). The API alone records nothing: spans and metrics go wherever the app's
 * SDK sends them, and without an SDK every call is the API's no-op.
 */
export async function loadOpenTelemetry(): Promise<OpenTelemetry | undefined> {
  try {
    return await loadOptionalPeer<OpenTelemetry>('@opentelemetry/api');
  } catch {
    return undefined;
  }
}
