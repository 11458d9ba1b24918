import { BadRequestException, Injectable, type PipeTransform } from '@nestjs/common';
import { z } from 'zod';

/** What `POST /refunds` takes: a payment intent's id and a whole, positive amount in cents. */
const REFUND_REQUEST = z.object({
  paymentIntentId: z.string().regex(/^pi_[A-Za-z0-9_]{1,250}$/, 'a payment intent id (pi_...)'),
  amount: z.number().int().min(1).max(2_147_483_647),
});

/** A refund request as the route reads it. */
export type RefundRequest = z.infer<typeof REFUND_REQUEST>;

/** Refuses a body that is not a refund request with 400 naming the fields; nothing is written. */
@Injectable()
export class RefundRequestPipe implements PipeTransform<unknown, RefundRequest> {
  transform(value: unknown): RefundRequest {
    const parsed = REFUND_REQUEST.safeParse(value);
    if (parsed.success) return parsed.data;
    const issues = parsed.error.issues.map((issue) => ({
      path: issue.path.join('.'),
      message: issue.message,
    }));
    throw new BadRequestException({
      statusCode: 400,
      error: 'Bad Request',
      message: `Invalid refund request: ${issues.map((issue) => `${issue.path}: ${issue.message}`).join('; ')}`,
      issues,
    });
  }
}
