import { unknownOption } from '../idempotency.messages.js';
import type { WebhookSecretOptions, WebhookSignatureOptions } from '../interfaces/index.js';
import { decodeBase64 } from './signature-crypto.js';

const badSignatureOption = (path: string, detail: string) => `IdempotencyModule option ${path} ${detail}`;

/** Stripe's and Standard Webhooks' own default tolerance, in seconds. */
export const DEFAULT_TOLERANCE_SECONDS = 300;

/** Standard Webhooks secrets are `whsec_` + base64 of the key bytes. */
const STANDARD_WEBHOOKS_PREFIX = 'whsec_';

/** Each sender of `signatures` and whether it signs a timestamp (so takes `toleranceSeconds`). */
const SENDERS: Record<keyof WebhookSignatureOptions, { timestamped: boolean }> = {
  stripe: { timestamped: true },
  github: { timestamped: false },
  standardWebhooks: { timestamped: true },
  shopify: { timestamped: false },
};

/** Suggests the known name closest to a misspelt one (the config's edit-distance helper). */
export type Suggest = (name: string, candidates: string[]) => string | undefined;

/**
 * Checks the `signatures` option at boot: only known senders and keys, a non-empty secret (or a
 * non-empty array of them) without surrounding whitespace, a positive tolerance, and for
 * Standard Webhooks a `whsec_<base64>` secret. Returns a copy, so later changes to the caller's
 * object cannot bypass the check. Every failure names the option path.
 */
export function checkSignatureOptions(value: unknown, suggest: Suggest): WebhookSignatureOptions {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new Error(badSignatureOption('signatures', `must be an object, got ${describeValue(value)}`));
  }
  const checked: Record<string, unknown> = {};
  for (const [sender, options] of Object.entries(value)) {
    if (!Object.hasOwn(SENDERS, sender)) {
      const suggestion = suggest(sender, Object.keys(SENDERS));
      throw new Error(
        unknownOption(`signatures.${sender}`, suggestion ? `signatures.${suggestion}` : undefined),
      );
    }
    if (options === undefined) continue; // forRootAsync factories spread unset env values
    checked[sender] = checkSender(sender as keyof WebhookSignatureOptions, options, suggest);
  }
  return checked as WebhookSignatureOptions;
}

function checkSender(sender: keyof WebhookSignatureOptions, options: unknown, suggest: Suggest): object {
  const path = `signatures.${sender}`;
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new Error(
      badSignatureOption(path, `must be an object with a secret, got ${describeValue(options)}`),
    );
  }
  const known = SENDERS[sender].timestamped ? ['secret', 'toleranceSeconds'] : ['secret'];
  for (const key of Object.keys(options)) {
    if (!known.includes(key)) {
      const suggestion = suggest(key, known);
      throw new Error(unknownOption(`${path}.${key}`, suggestion ? `${path}.${suggestion}` : undefined));
    }
  }
  const { secret, toleranceSeconds } = options as { secret?: unknown; toleranceSeconds?: unknown };
  const secrets = Array.isArray(secret) ? secret : [secret];
  if (secrets.length === 0) {
    throw new Error(badSignatureOption(`${path}.secret`, 'is an empty array; give at least one secret'));
  }
  for (const [index, one] of secrets.entries()) {
    const where = Array.isArray(secret) ? `${path}.secret[${index}]` : `${path}.secret`;
    if (typeof one !== 'string' || one.length === 0) {
      throw new Error(badSignatureOption(where, `must be a non-empty string, got ${describeValue(one)}`));
    }
    if (one.trim() !== one) {
      throw new Error(
        badSignatureOption(
          where,
          'has leading or trailing whitespace (a pasted newline?); every signature would fail',
        ),
      );
    }
    if (sender === 'standardWebhooks' && standardWebhooksKey(one).length === 0) {
      throw new Error(badSignatureOption(where, 'must be whsec_ followed by the base64 of the key'));
    }
  }
  if (toleranceSeconds !== undefined && !(typeof toleranceSeconds === 'number' && toleranceSeconds > 0)) {
    throw new Error(
      badSignatureOption(
        `${path}.toleranceSeconds`,
        `must be a positive number, got ${describeValue(toleranceSeconds)}`,
      ),
    );
  }
  return { ...options, secret: Array.isArray(secret) ? [...secret] : secret };
}

/** A sender's secrets as a list, or an empty one when it is not configured. */
export function secretsOf(options: WebhookSecretOptions | undefined): string[] {
  if (!options) return [];
  return Array.isArray(options.secret) ? options.secret : [options.secret];
}

/**
 * A Standard Webhooks key: the bytes of the base64 after `whsec_` (the prefix is optional, as in
 * the standardwebhooks SDK). Empty when the secret is not base64.
 */
export function standardWebhooksKey(secret: string): Buffer {
  const encoded = secret.startsWith(STANDARD_WEBHOOKS_PREFIX)
    ? secret.slice(STANDARD_WEBHOOKS_PREFIX.length)
    : secret;
  return decodeBase64(encoded) ?? Buffer.alloc(0);
}

function describeValue(value: unknown): string {
  if (typeof value === 'string') return `'${value}'`;
  if (Array.isArray(value)) return 'an array';
  return value === null ? 'null' : typeof value === 'object' ? 'an object' : String(value);
}
