import { Injectable } from '@nestjs/common';
import {
  headerMalformed,
  signatureMismatch,
  signatureTooNew,
  signatureTooOld,
} from '../idempotency.messages.js';
import type { SignedRequest } from './raw-body.js';
import { decodeBase64, digestsEqual, hmacSha256 } from './signature-crypto.js';
import { DEFAULT_TOLERANCE_SECONDS, standardWebhooksKey } from './signature-options.js';
import { requireHeader, WebhookSignatureError } from './webhook-signature.error.js';
import { WebhookSignatureGuard } from './webhook-signature.guard.js';

/** The three headers of the Standard Webhooks specification, lower-case as the spec writes them. */
export const STANDARD_WEBHOOKS_HEADERS = {
  id: 'webhook-id',
  timestamp: 'webhook-timestamp',
  signature: 'webhook-signature',
} as const;

/** What a Standard Webhooks delivery carries in its headers. */
export interface StandardWebhookHeaders {
  id: unknown;
  timestamp: unknown;
  signature: unknown;
}

/** Unix seconds, as the spec sends them; parseInt would also take '12abc'. */
const UNIX_SECONDS = /^\d{1,15}$/;

/**
 * The Standard Webhooks check (the algorithm of the `standardwebhooks` SDK, on node:crypto):
 * `webhook-timestamp` within `toleranceSeconds` of now, both ways (a signature from the future is
 * as suspect as an old one), then one of the space-separated `v1,<base64>` entries of
 * `webhook-signature` equal, in constant time, to the HMAC-SHA256 of
 * `<webhook-id>.<webhook-timestamp>.<raw body>` keyed with one of `keys` (the bytes of a
 * `whsec_<base64>` secret). Entries of other versions (`v1a` asymmetric signatures) are skipped.
 */
export function verifyStandardWebhook(
  rawBody: Buffer,
  headers: StandardWebhookHeaders,
  keys: readonly Buffer[],
  toleranceSeconds: number = DEFAULT_TOLERANCE_SECONDS,
  nowSeconds: number = Math.floor(Date.now() / 1000),
): void {
  const id = requireHeader(headers.id, STANDARD_WEBHOOKS_HEADERS.id);
  const timestamp = requireHeader(headers.timestamp, STANDARD_WEBHOOKS_HEADERS.timestamp);
  const signature = requireHeader(headers.signature, STANDARD_WEBHOOKS_HEADERS.signature);
  if (!UNIX_SECONDS.test(timestamp)) {
    throw new WebhookSignatureError(
      'malformed',
      STANDARD_WEBHOOKS_HEADERS.timestamp,
      headerMalformed(STANDARD_WEBHOOKS_HEADERS.timestamp, 'Unix time in whole seconds'),
    );
  }
  const received = signatures(signature);
  const age = nowSeconds - Number(timestamp);
  if (age > toleranceSeconds) {
    throw new WebhookSignatureError(
      'stale',
      STANDARD_WEBHOOKS_HEADERS.timestamp,
      signatureTooOld(STANDARD_WEBHOOKS_HEADERS.timestamp, age, toleranceSeconds),
    );
  }
  if (-age > toleranceSeconds) {
    throw new WebhookSignatureError(
      'stale',
      STANDARD_WEBHOOKS_HEADERS.timestamp,
      signatureTooNew(STANDARD_WEBHOOKS_HEADERS.timestamp, -age, toleranceSeconds),
    );
  }
  const signed = `${id}.${timestamp}.`;
  const matches = keys.some((key) => {
    const expected = hmacSha256(key, signed, rawBody);
    return received.some((candidate) => digestsEqual(expected, candidate));
  });
  if (!matches) {
    throw new WebhookSignatureError(
      'mismatch',
      STANDARD_WEBHOOKS_HEADERS.signature,
      signatureMismatch(
        STANDARD_WEBHOOKS_HEADERS.signature,
        'webhook-id, webhook-timestamp and the raw request body',
      ),
    );
  }
}

/** The v1 signatures of a `webhook-signature` header; refused when there is none, or one is not base64. */
function signatures(header: string): Buffer[] {
  const found: Buffer[] = [];
  let malformed = false;
  for (const entry of header.split(' ')) {
    if (entry.length === 0) continue;
    const comma = entry.indexOf(',');
    if (comma <= 0) malformed = true;
    else if (entry.slice(0, comma) === 'v1') {
      const bytes = decodeBase64(entry.slice(comma + 1));
      if (bytes === undefined) malformed = true;
      else found.push(bytes);
    }
  }
  if (malformed || found.length === 0) {
    throw new WebhookSignatureError(
      'malformed',
      STANDARD_WEBHOOKS_HEADERS.signature,
      headerMalformed(STANDARD_WEBHOOKS_HEADERS.signature, 'space-separated v1,<base64> signatures'),
    );
  }
  return found;
}

/**
 * Lets a Standard Webhooks delivery (Svix, Resend, Clerk, ...) through only if it is signed
 * under `signatures.standardWebhooks.secret` and its timestamp is within `toleranceSeconds`:
 * `@UseGuards(StandardWebhooksSignatureGuard)` or
 * `@IdempotentWebhook({ key: standardWebhookKey, signature: 'standard-webhooks' })`. Needs
 * `rawBody: true`.
 */
@Injectable()
export class StandardWebhooksSignatureGuard extends WebhookSignatureGuard {
  protected readonly option = 'standardWebhooks';
  // The signature header first: raw-body messages name it.
  protected readonly headers = [
    { name: STANDARD_WEBHOOKS_HEADERS.signature, display: STANDARD_WEBHOOKS_HEADERS.signature },
    { name: STANDARD_WEBHOOKS_HEADERS.id, display: STANDARD_WEBHOOKS_HEADERS.id },
    { name: STANDARD_WEBHOOKS_HEADERS.timestamp, display: STANDARD_WEBHOOKS_HEADERS.timestamp },
  ];
  private keys?: Buffer[];

  protected verify(request: SignedRequest, rawBody: Buffer, secrets: readonly string[]): void {
    // Decoded once: the secrets are the boot-checked config, the same on every delivery.
    this.keys ??= secrets.map(standardWebhooksKey);
    verifyStandardWebhook(
      rawBody,
      {
        id: request.headers[STANDARD_WEBHOOKS_HEADERS.id],
        timestamp: request.headers[STANDARD_WEBHOOKS_HEADERS.timestamp],
        signature: request.headers[STANDARD_WEBHOOKS_HEADERS.signature],
      },
      this.keys,
      this.config.signatures?.standardWebhooks?.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS,
    );
  }
}
