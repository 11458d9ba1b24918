/**
 * What a claim checks beyond its key: the fingerprint of what the delivery carried, against the
 * one stored with the claim (a key reused for another request, or for another event), and the
 * response a handler stored for its retries. Transport-neutral: the HTTP and RPC transports make
 * the fingerprints and responses, the strategies store and compare them.
 */

/**
 * What a delivery whose fingerprint differs from its claim's gets. `'refuse'`: nothing runs, it
 * is answered 422 (`IdempotencyKeyReusedError`), whether the claim is done, failed or in flight.
 * `'warn'`: it is answered as it would be without the check (replayed when done, run again when
 * failed, in flight), and the conflict is logged once per handler and counted (`key_conflict`).
 */
export type KeyConflictPolicy = 'refuse' | 'warn';

/** A handler's key checks, resolved once per handler (ClaimSpec.checks). */
export interface ClaimChecks {
  /** See KeyConflictPolicy. */
  readonly conflicts: KeyConflictPolicy;
}

/** One delivery's check, handed to the strategy with its key. */
export interface ClaimCheck {
  /** The delivery's fingerprint (hex SHA-256), or null when the handler takes none. */
  readonly fingerprint: string | null;
  /** True when a conflicting delivery runs nothing (`'refuse'`). */
  readonly refuse: boolean;
  /**
   * True when the delivery stores its response with its claim (request mode). In transaction mode
   * its claim's row is then written by the COMMIT, with the response, in one insert
   * (ClaimStatements.claimAtCommit). Default false.
   */
  readonly storesResponse?: boolean;
}

/**
 * What a handler answered, stored with its claim and replayed to every retry: over HTTP the
 * status, the headers the route lists (and the Content-Type the handler set) and the body; over
 * RPC the reply. The body is kept as the JSON text it was first sent as (`json`): a jsonb column
 * keeps a string byte for byte, where it would sort an object's keys, so a replay answers the
 * same bytes. `omitted` says why a body is not there when the handler returned one (external
 * mode only: the work happened, so a body that cannot be stored is left out rather than the
 * completion refused). Read the body with storedBody(), which reads rows of both shapes.
 */
export interface StoredResponse {
  /** HTTP status. Absent for an RPC reply. */
  readonly status?: number;
  /**
   * The listed headers that were set, and the Content-Type if the handler set one, by their
   * names as the handler wrote them (Express; Fastify writes every name in lower case). Rows
   * stored before the names were kept: by lower-case name. A header set as a list (two
   * `Set-Cookie`s) is kept as the list, since no single value can stand for several cookies.
   */
  readonly headers?: Readonly<Record<string, string | readonly string[]>>;
  /** The body's JSON text, as `JSON.stringify` gave it when it was first answered; absent for none. */
  readonly json?: string;
  /**
   * Rows stored before `json`: the body as a JSON value (an object, array, string, number,
   * boolean or null), its objects' keys in jsonb's order. Not written any more.
   */
  readonly body?: unknown;
  /** Why the body was not stored. */
  readonly omitted?: 'too_large' | 'not_json';
}

/**
 * The body of a stored response as the handler returned it, serialised again by the same code
 * to the same bytes (`JSON.stringify` of what `JSON.parse` makes of its own text is that text),
 * or undefined for none. A row of the earlier shape gives its jsonb body.
 */
export function storedBody(response: StoredResponse): unknown {
  return response.json !== undefined ? JSON.parse(response.json) : response.body;
}

/**
 * True when a delivery's fingerprint and the claim's differ. A claim made before the check (no
 * fingerprint stored) or a delivery without one conflicts with nothing: there is nothing to tell.
 */
export function fingerprintsConflict(delivery: string | null, stored: string | null | undefined): boolean {
  return delivery !== null && stored !== null && stored !== undefined && delivery !== stored;
}

/** The state of the claim a conflicting delivery met. */
export type ConflictState = 'done' | 'failed' | 'in_flight';
