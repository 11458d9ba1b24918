import { Injectable } from '@nestjs/common';
import { headerMalformed } from '../idempotency.messages.js';
import type { SignedRequest } from './raw-body.js';
import type { SignedBodyType } from './signed-body.js';
import { requireBodyHmac, requireHeader, WebhookSignatureError } from './webhook-signature.error.js';
import { WebhookSignatureGuard } from './webhook-signature.guard.js';

/** GitHub's signature header, as its documentation spells it. */
export const GITHUB_SIGNATURE_HEADER = 'X-Hub-Signature-256';

const GITHUB_SIGNATURE = /^sha256=([0-9a-f]{64})$/i;

/**
 * GitHub's check: `X-Hub-Signature-256` is `sha256=` + the hex HMAC-SHA256 of the raw body,
 * keyed with the webhook's secret, compared in constant time. GitHub signs no timestamp, so a
 * replay is caught by the delivery id's claim, not here.
 */
export function verifyGithubSignature(rawBody: Buffer, header: unknown, secrets: readonly string[]): void {
  const value = requireHeader(header, GITHUB_SIGNATURE_HEADER);
  const match = GITHUB_SIGNATURE.exec(value);
  if (!match) {
    throw new WebhookSignatureError(
      'malformed',
      GITHUB_SIGNATURE_HEADER,
      headerMalformed(GITHUB_SIGNATURE_HEADER, 'sha256= followed by 64 hexadecimal digits'),
    );
  }
  const received = Buffer.from(match[1], 'hex');
  requireBodyHmac(GITHUB_SIGNATURE_HEADER, rawBody, secrets, received);
}

/**
 * Lets a GitHub delivery through only if `X-Hub-Signature-256` matches its raw body under
 * `signatures.github.secret`: `@UseGuards(GithubSignatureGuard)` or
 * `@IdempotentWebhook({ key: githubDeliveryKey, signature: 'github' })`. Needs `rawBody: true`.
 */
@Injectable()
export class GithubSignatureGuard extends WebhookSignatureGuard {
  protected readonly option = 'github';
  protected readonly headers = [{ name: 'x-hub-signature-256', display: GITHUB_SIGNATURE_HEADER }];
  // A GitHub webhook's settings offer a form body (`payload=<JSON>`) beside JSON.
  protected override readonly signedBodies: readonly SignedBodyType[] = ['json', 'form'];

  protected verify(request: SignedRequest, rawBody: Buffer, secrets: readonly string[]): void {
    verifyGithubSignature(rawBody, request.headers['x-hub-signature-256'], secrets);
  }
}
