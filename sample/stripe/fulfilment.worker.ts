import { Injectable, Logger } from '@nestjs/common';
import { IdempotencyContext, IdempotentWorker, type HandoffJob } from '../idempotency.js';
import { FulfilmentClient, type FulfilmentRequest } from './fulfilment.client.js';
import { FULFILMENT_QUEUE, STRIPE_SCOPES } from './stripe-scopes.js';

/**
 * The async endpoint's worker: each fulfilment job runs under an external-mode lease on the
 * event (IDEMPOTENCY_LEASE_MS, the module's `leaseMs`), and POSTs `{eventId, sessionId, email}`
 * to FULFILMENT_URL with `Idempotency-Key: <downstreamKey>`, the same call as the synchronous
 * endpoint: the job's key is the event's id (the async endpoint enqueues it so), and downstreamKey
 * is that id as it is, or its `sha256-...` form when it holds what no header carries.
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
    // The job's key (here the event's id), header-safe: never job.event.key, which every job of
    // one event would share.
    const outcome = await this.client.send(job.data, this.context.downstreamKey);
    if (outcome === 'sent') this.logger.log(`${job.event.key}: fulfilment sent for ${job.data.sessionId}`);
  }
}
