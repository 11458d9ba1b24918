import diagnosticsChannel from 'node:diagnostics_channel';

/** What every outcome channel publishes: the delivery's scope and key, and which outcome it was. */
export interface OutcomeChannelMessage {
  /** `'replayed'`, `'in_flight'`, `'lease_lost'` or `'stale'`. */
  outcome: string;
  scope: string;
  key: string;
}

/**
 * The `node:diagnostics_channel` names the library publishes on, one per outcome that a tool may
 * want to react to without wrapping the library: a duplicate answered from the record
 * (`replayed`), a duplicate of a delivery still running (`in_flight`), an external-mode handler
 * that finished after its lease was taken over (`lease_lost`, its side effect may have run
 * twice), and an event refused as older than one already processed (`stale`, counted by the
 * ordering guard). Subscribe with `diagnostics_channel.subscribe(name, listener)`; the message is
 * an OutcomeChannelMessage. Publishing costs one `hasSubscribers` check while nobody listens.
 */
export const IDEMPOTENCY_CHANNELS = {
  replayed: 'nest-idempotent-webhooks:replayed',
  in_flight: 'nest-idempotent-webhooks:in-flight',
  lease_lost: 'nest-idempotent-webhooks:lease-lost',
  stale: 'nest-idempotent-webhooks:stale',
} as const;

/**
 * The channel objects by outcome, made once. diagnostics_channel keeps one channel per name in
 * the process, so the ESM and CommonJS builds, loaded side by side, publish on the same ones.
 */
const CHANNELS: ReadonlyMap<string, diagnosticsChannel.Channel> = new Map(
  Object.entries(IDEMPOTENCY_CHANNELS).map(([outcome, name]) => [outcome, diagnosticsChannel.channel(name)]),
);

/**
 * Publishes one counted outcome on its channel, if it has one and someone listens. Keyed by the
 * outcome's name, so an outcome added to ClaimOutcome later (`stale`) publishes once it is counted.
 */
export function publishOutcome(outcome: string, scope: string, key: string): void {
  const channel = CHANNELS.get(outcome);
  if (channel?.hasSubscribers) channel.publish({ outcome, scope, key } satisfies OutcomeChannelMessage);
}
