/**
 * True for an HttpException (or anything shaped like one) with a 4xx status: the handler refused
 * its input on purpose (a validation pipe, a check of its own). Both modes leave no claim for a
 * refusal, so it is neither a failed attempt nor, repeated, a poison event: the same input would
 * be refused again, and the sender has been told why.
 */
export function isRefusal(error: unknown): boolean {
  const status = (error as { getStatus?: () => unknown })?.getStatus?.();
  return typeof status === 'number' && status >= 400 && status < 500;
}
