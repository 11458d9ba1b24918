import { BadGatewayException, GatewayTimeoutException, Injectable, Logger } from '@nestjs/common';
import type { SampleConfig } from '../config/sample-config.js';
import { InjectSampleConfig } from '../config/sample-config.module.js';

/** What the fulfilment API receives for a completed checkout. */
export interface FulfilmentRequest {
  eventId: string;
  sessionId: string;
  email: string | null;
}

/**
 * Longest wait for the fulfilment API. Keep it well under the lease (IDEMPOTENCY_LEASE_MS): a call
 * still running when the lease runs out may be started again by another worker.
 */
export const FULFILMENT_TIMEOUT_MS = 10_000;

/**
 * The downstream call: work outside the database, which no transaction can undo. Every failure
 * (non-2xx, network error, timeout) throws, so the handler fails, the sender gets a 5xx, and the
 * lease is released for the next delivery to run it again.
 */
@Injectable()
export class FulfilmentClient {
  private readonly logger = new Logger(FulfilmentClient.name);

  constructor(@InjectSampleConfig() private readonly config: SampleConfig) {}

  /**
   * POSTs `request` (or only logs it when FULFILMENT_URL is unset) with `Idempotency-Key:
   * <idempotencyKey>`: IdempotencyContext.downstreamKey, the Stripe event's id in a form any header
   * carries, the same on every attempt. If a crashed attempt did reach the API, the API can tell
   * the retry apart (the header points the other way from webhook dedupe: we are the sender here).
   */
  async send(request: FulfilmentRequest, idempotencyKey: string): Promise<'sent' | 'logged'> {
    const url = this.config.fulfilmentUrl;
    if (!url) {
      this.logger.log(`FULFILMENT_URL is not set: would fulfil ${JSON.stringify(request)}`);
      return 'logged';
    }
    let status: number;
    try {
      const response = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': idempotencyKey },
        body: JSON.stringify(request),
        signal: AbortSignal.timeout(FULFILMENT_TIMEOUT_MS),
      });
      status = response.status;
      await response.arrayBuffer(); // read to the end, inside the timeout, so the socket is reusable
    } catch (error) {
      if (error instanceof Error && error.name === 'TimeoutError') {
        throw new GatewayTimeoutException(`Fulfilment API did not answer within ${FULFILMENT_TIMEOUT_MS} ms`);
      }
      throw new BadGatewayException(`Fulfilment API unreachable: ${describe(error)}`);
    }
    if (status < 200 || status > 299) throw new BadGatewayException(`Fulfilment API answered ${status}`);
    return 'sent';
  }
}

/** undici puts the useful part (ECONNREFUSED, "other side closed") in `cause`. */
function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause instanceof Error ? `: ${error.cause.message}` : '';
  return `${error.message}${cause}`;
}
