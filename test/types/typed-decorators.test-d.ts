/**
 * Type test (tsd-style) of the typed handler decorators: `npm run typecheck` compiles this file
 * (tsconfig.json includes test/), nothing runs it. Each `@ts-expect-error` line must fail to
 * compile, and does so for the reason its comment gives: were it to compile, the directive would
 * be unused, itself an error, so CI fails both when a wrong use compiles and when a right one
 * (every line without the directive) does not.
 *
 * A key's return type is not constrained: returning a non-string is a documented runtime answer
 * (400, `Idempotency key of ... must be a string`), which the bad-input fixtures rely on.
 */
import { applyDecorators, Body, Controller, Post, Req } from '@nestjs/common';
import {
  githubDeliveryKey,
  IdempotentRequest,
  IdempotentWebhook,
  IdempotentWorker,
  stripeEventKey,
  stripeEventOrder,
  type HandoffJob,
} from '../../lib/index.js';

interface PaymentEvent {
  id: string;
  created: number;
  data: { object: { id: string } };
}

interface OrderShipped {
  shipmentId: number;
}

interface DeliveryRequest {
  headers: Record<string, string | undefined>;
}

interface AuthenticatedRequest {
  user: { id: string };
}

interface RefundRequest {
  amount: number;
}

interface Fulfilment {
  sessionId: string;
}

/** What compiles: the event inferred from the handler, given, or left `any`. */
@Controller('typed')
export class TypedWebhooks {
  // Inferred from the handler's first parameter: `event` is a PaymentEvent, not `any`.
  @Post('inferred')
  @IdempotentWebhook({
    key: (event) => {
      // @ts-expect-error -- inferred as PaymentEvent, which has no `idd` (were it `any`, this would compile)
      void event.idd;
      return event.id;
    },
  })
  inferred(@Body() event: PaymentEvent) {
    return event.id;
  }

  @Post('given')
  @IdempotentWebhook<PaymentEvent>({ key: (event) => event.id, fingerprint: (event) => event.id })
  given(@Body() event: PaymentEvent, _other: string) {
    return event;
  }

  // A key annotated with a type the event is one of: checked against the handler's, not deciding it.
  @Post('wider-key')
  @IdempotentWebhook({ key: (event: { id: string }) => event.id })
  widerKey(@Body() event: PaymentEvent) {
    return event;
  }

  @Post('presets')
  @IdempotentWebhook({ key: stripeEventKey, signature: 'stripe', order: stripeEventOrder() })
  presets(@Body() event: PaymentEvent) {
    return event;
  }

  @Post('order')
  @IdempotentWebhook({
    key: (event) => event.id,
    order: { entity: (event) => event.data.object.id, version: (event) => event.created },
    onKeyConflict: 'refuse',
  })
  order(@Body() event: PaymentEvent) {
    return event;
  }

  // The request typed too, from the key's annotation.
  @Post('request')
  @IdempotentWebhook({ key: (_event, request: DeliveryRequest) => request.headers['x-delivery'] })
  request(@Body() event: PaymentEvent) {
    return event;
  }

  // Untyped uses compile as before: no parameter, an `any` one, or `<any>` when the event is not first.
  @Post('no-parameter')
  @IdempotentWebhook({ key: githubDeliveryKey, mode: 'external', leaseMs: 60_000 })
  noParameter() {
    return 'ok';
  }

  @Post('any')
  @IdempotentWebhook({ key: (event) => event.anything.at.all })
  untyped(@Body() event: any) {
    return event;
  }

  @Post('event-second')
  @IdempotentWebhook<any>({ key: (event) => event.id })
  eventSecond(@Req() request: DeliveryRequest, @Body() event: PaymentEvent) {
    return [request, event];
  }

  // A microservice handler: (data, context).
  @IdempotentWebhook({ key: (data) => String(data.shipmentId) })
  shipped(data: OrderShipped, _context: unknown) {
    return data;
  }
}

/** A decorator of your own composed of it still compiles. */
export const StripeWebhook = (path: string) =>
  applyDecorators(Post(path), IdempotentWebhook({ key: stripeEventKey, signature: 'stripe' }));

/** What does not compile, and why. */
export class WrongWebhooks {
  @IdempotentWebhook({
    // @ts-expect-error -- a wrong key property: PaymentEvent (inferred from the handler) has no `eventId`
    key: (event) => event.eventId,
  })
  wrongKey(event: PaymentEvent) {
    return event;
  }

  @IdempotentWebhook<PaymentEvent>({
    // @ts-expect-error -- a wrong key property, the event given
    key: (event) => event.eventId,
  })
  wrongGivenKey(event: PaymentEvent) {
    return event;
  }

  // @ts-expect-error -- the handler's event is not the one given
  @IdempotentWebhook<PaymentEvent>({ key: (event) => event.id })
  wrongHandler(event: OrderShipped) {
    return event;
  }

  @IdempotentWebhook({
    // @ts-expect-error -- a key annotated with a type the handler's event is not
    key: (event: { id: number }) => event.id,
  })
  wrongKeyType(event: PaymentEvent) {
    return event;
  }

  @IdempotentWebhook({
    key: (event) => event.id,
    // @ts-expect-error -- a wrong option name
    signatur: 'stripe',
  })
  wrongOption(event: PaymentEvent) {
    return event;
  }

  @IdempotentWebhook({
    key: (event) => event.id,
    // @ts-expect-error -- a wrong option type: not a sender the library verifies
    signature: 'paypal',
  })
  wrongSignature(event: PaymentEvent) {
    return event;
  }

  @IdempotentWebhook({
    key: (event) => event.id,
    // @ts-expect-error -- a wrong option type: leaseMs is a number
    leaseMs: '60s',
  })
  wrongLease(event: PaymentEvent) {
    return event;
  }

  @IdempotentWebhook({
    key: (event) => event.id,
    // @ts-expect-error -- order reads the handler's event too: PaymentEvent has no `updatedAt`
    order: { entity: (event) => event.data.object.id, version: (event) => event.updatedAt },
  })
  wrongOrder(event: PaymentEvent) {
    return event;
  }

  @IdempotentWebhook({
    key: (event) => event.id,
    // @ts-expect-error -- so does a fingerprint function
    fingerprint: (event) => event.body,
  })
  wrongFingerprint(event: PaymentEvent) {
    return event;
  }
}

/** `@IdempotentRequest<Request, Body>`. */
export class TypedRequests {
  @IdempotentRequest({ owner: (request) => request.user.id })
  untyped(body: RefundRequest) {
    return body;
  }

  @IdempotentRequest<AuthenticatedRequest>({
    owner: (request) => request.user.id,
    fingerprint: (request) => request.user.id,
    replayHeaders: ['Location'],
  })
  given(body: RefundRequest) {
    return body;
  }

  @IdempotentRequest({ owner: (request: AuthenticatedRequest) => request.user.id })
  annotated(body: RefundRequest) {
    return body;
  }

  @IdempotentRequest<AuthenticatedRequest, RefundRequest>({ owner: false, required: false })
  withBody(body: RefundRequest, _response: unknown) {
    return body;
  }

  @IdempotentRequest<AuthenticatedRequest>({
    // @ts-expect-error -- a wrong owner property: AuthenticatedRequest's user has no `name`
    owner: (request) => request.user.name,
  })
  wrongOwner(body: RefundRequest) {
    return body;
  }

  // @ts-expect-error -- owner is required
  @IdempotentRequest({ required: false })
  noOwner(body: RefundRequest) {
    return body;
  }

  @IdempotentRequest({
    owner: false,
    // @ts-expect-error -- a wrong option name
    requird: false,
  })
  wrongOption(body: RefundRequest) {
    return body;
  }

  @IdempotentRequest({
    owner: false,
    // @ts-expect-error -- a wrong option type: a list of header names
    replayHeaders: 'Location',
  })
  wrongType(body: RefundRequest) {
    return body;
  }

  // @ts-expect-error -- the handler's body is not the one given
  @IdempotentRequest<AuthenticatedRequest, RefundRequest>({ owner: false })
  wrongBody(body: Fulfilment) {
    return body;
  }
}

/** `@IdempotentWorker<Data>`. */
export class TypedWorkers {
  @IdempotentWorker('fulfilment', { external: true, leaseMs: 60_000, concurrency: 4 })
  async inferred(job: HandoffJob<Fulfilment>) {
    return job.data.sessionId;
  }

  @IdempotentWorker<Fulfilment>('fulfilment')
  async given(job: HandoffJob<Fulfilment>) {
    return job.data.sessionId;
  }

  @IdempotentWorker('fulfilment')
  async untyped(job: HandoffJob) {
    return job.data;
  }

  // @ts-expect-error -- the job's data is not the one given
  @IdempotentWorker<Fulfilment>('fulfilment')
  async wrongData(job: HandoffJob<RefundRequest>) {
    return job.data;
  }

  // @ts-expect-error -- the first parameter is the job, not its data
  @IdempotentWorker<Fulfilment>('fulfilment')
  async notAJob(data: Fulfilment) {
    return data;
  }

  // @ts-expect-error -- a wrong option name
  @IdempotentWorker('fulfilment', { concurency: 2 })
  async wrongOption(job: HandoffJob<Fulfilment>) {
    return job;
  }

  // @ts-expect-error -- a wrong option type: concurrency is a number
  @IdempotentWorker('fulfilment', { concurrency: '2' })
  async wrongType(job: HandoffJob<Fulfilment>) {
    return job;
  }
}
