import { BadRequestException, type PipeTransform } from '@nestjs/common';
import type { z } from 'zod';
import { stripeEventEnvelope, type StripeEventOf, type StripeEventSchemas } from './stripe-events.schema.js';

/** One thing wrong with an event: where (`data.object.currency`) and what. */
export interface StripeEventIssue {
  path: string;
  message: string;
}

/**
 * Validates a verified Stripe event before the handler runs: `@Body(new StripeEventPipe(ORDERS_EVENTS))`.
 * An event of a type in `schemas` must match its schema, and the handler gets the parsed event
 * (only the checked fields); any other type must only carry an id and a type, and the handler
 * gets it marked `ignored`. A malformed event is answered 400 naming each bad field, e.g.
 * `Invalid payment_intent.succeeded event: data.object.amount_received: Invalid input: expected
 * number, received string`, with the same as `issues: [{ path, message }]`.
 *
 * Nest runs pipes after interceptors, so this runs inside the library's claim, before the handler
 * writes anything: in transaction mode the refusal rolls the claim back, so no row is left and a
 * corrected redelivery is processed. A value of the wrong type is refused at its own level (zod
 * does not walk into an array where a number belongs), so no recursive serialiser downstream (pg's
 * array parameters, JSON.stringify of the answer or of a job) ever sees a 40,000-deep nesting.
 */
export class StripeEventPipe<Schemas extends StripeEventSchemas> implements PipeTransform<
  unknown,
  StripeEventOf<Schemas>
> {
  // A Map, not the object: an event type such as `constructor` must not find Object.prototype's.
  private readonly schemas: ReadonlyMap<string, z.ZodType<{ id: string; type: string }>>;

  constructor(schemas: Schemas) {
    this.schemas = new Map(Object.entries(schemas));
  }

  transform(value: unknown): StripeEventOf<Schemas> {
    const envelope = parse(stripeEventEnvelope, value, 'Stripe');
    const schema = this.schemas.get(envelope.type);
    if (!schema) return { id: envelope.id, type: envelope.type, ignored: true };
    return parse(schema, value, envelope.type) as StripeEventOf<Schemas>;
  }
}

/** `value` parsed by `schema`, or a 400 naming every field that does not match. */
function parse<Output>(schema: z.ZodType<Output>, value: unknown, type: string): Output {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const issues: StripeEventIssue[] = [];
  for (const issue of result.error.issues) {
    const path = issue.path.length === 0 ? 'the event' : issue.path.map(String).join('.');
    // One per field: a number too large for the column is also too large for a safe integer.
    if (!issues.some((known) => known.path === path)) issues.push({ path, message: issue.message });
  }
  const described = issues.map(({ path, message }) => `${path}: ${message}`).join('; ');
  throw new BadRequestException({
    statusCode: 400,
    error: 'Bad Request',
    message: `Invalid ${type} event: ${described}`,
    issues,
  });
}
