import { Body, Controller, Post, Req, Res, UseGuards } from '@nestjs/common';
import { IdempotencyContext, IdempotentRequest } from '../idempotency.js';
import { BearerUserGuard, type AuthenticatedRequest } from './bearer-user.guard.js';
import { RefundRequestPipe, type RefundRequest } from './refund-request.pipe.js';
import { Refund } from './refund.entity.js';

/** The response fields the route sets; Express's response has them. */
interface LocatedResponse {
  location(url: string): unknown;
}

/**
 * `POST /refunds`, a route of the sample's own API (not a webhook): the client sends an
 * `Idempotency-Key` (required), and a retry after a lost answer gets the same 201, body and
 * `Location`, replayed, with no second refund. The key is the caller's own: scoped to the bearer
 * token's user, so one user's key never replays another's refund.
 */
@Controller('refunds')
export class RefundsController {
  constructor(private readonly context: IdempotencyContext) {}

  @Post()
  @UseGuards(BearerUserGuard)
  @IdempotentRequest({ scope: 'refunds.create', owner: (request: AuthenticatedRequest) => request.userId })
  async create(
    @Req() request: AuthenticatedRequest,
    @Body(RefundRequestPipe) body: RefundRequest,
    @Res({ passthrough: true }) response: LocatedResponse,
  ) {
    // In the claim's transaction: the refund, the claim and the stored response commit together.
    const refund = await this.context.manager.save(Refund, {
      userId: request.userId!,
      paymentIntentId: body.paymentIntentId,
      amount: body.amount,
    });
    response.location(`/refunds/${refund.id}`);
    return {
      id: refund.id,
      user_id: refund.userId,
      payment_intent_id: refund.paymentIntentId,
      amount: refund.amount,
    };
  }
}
