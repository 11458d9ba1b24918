import { Injectable, Logger } from '@nestjs/common';
import { IdempotencyContext, IdempotentWorker, type HandoffJob } from '../idempotency.js';
import { FulfilmentClient, type FulfilmentRequest } from './fulfilment.client.js';
import { FULFILMENT_QUEUE, STRIPE_SCOPES } from './stripe-scopes.js';

/**
 * The async endpoint's worker: each fulfilment job runs under an external-mode lease on the
 * event (IDEMPOTENCY_LEASE_MS, the module's `leaseMs`), and POSTs `{eventId, sessionId, email}`
 * to FULFILMENT_URL with `Idempotency-Key: <event.id>`, the same call as the synchronous endpoint.
 * A non-2xx answer, a network error or the 10 s timeout throws: the job fails, and pg-boss retries
 * it (after 3-6 s, then doubling; four retries), then moves it to the dead-letter queue, which the
 * reporter logs. A worker killed mid-call leaves its job active: once the job expires
 * (IDEMPOTENCY_LEASE_MS, as the lease) pg-boss hands it out again, the lease is re-claimed, and
 * the API sees the same Idempotency-Key.
 */
@Injectable()
export class FulfilmentWorker {
  private readonly logger = new Logger(FulfilmentWorker.name);

  constructor(
    private readonly client: FulfilmentClient,
    private readonly context: IdempotencyContext,
  ) {}

  @IdempotentWorker(FULFILMENT_QUEUE, { external: true, scope: STRIPE_SCOPES.fulfilmentWorker })
  async fulfil(job: HandoffJob<FulfilmentRequest>): Promise<void> {
    const attempt = this.context.attempt ?? 1;
    if (attempt > 1) {
      this.logger.warn(`${job.event.key}: attempt ${attempt}, the fulfilment API may already have seen it`);
    }
    const outcome = await this.client.send(job.data, job.event.key);
    if (outcome === 'sent') this.logger.log(`${job.event.key}: fulfilment sent for ${job.data.sessionId}`);
  }
}
