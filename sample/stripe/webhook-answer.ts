/** What the sample's webhook handlers answer for a delivery they processed (200). */
export interface WebhookAnswer {
  received: true;
  eventId: string;
  type: string;
  /** What the delivery changed, for the demo and for people reading logs. */
  effect: string;
}

/** The answer for `event` (validated: its type is a bounded string), which had `effect`. */
export function webhookAnswer(event: { id: string; type: string }, effect: string): WebhookAnswer {
  return { received: true, eventId: event.id, type: event.type, effect };
}
