/**
 * Remembers, per handler, which key each webhook fingerprint last arrived under, for a while: the
 * same fingerprint under another key within the window is one event whose key changes between
 * its copies (taken from the moment of arrival: a timestamp, a per-request UUID), which turns
 * every retry into a new event. In memory, bounded: two generations of maps, the older dropped
 * whole when the newer fills, so that a delivery costs two lookups and one insert, never an
 * eviction walk. Pure, no Nest: KeyFindings reports what it finds.
 */
export class UnstableKeys {
  /** The fingerprints seen lately; once it holds half the capacity it becomes `previous`. */
  private current = new Map<string, { key: string; at: number }>();
  /** The generation before: forgotten whole when the next one fills (no per-entry eviction). */
  private previous = new Map<string, { key: string; at: number }>();

  constructor(
    /** How long a fingerprint is remembered, in ms. */
    private readonly windowMs: number,
    /** How many fingerprints are remembered at most (two generations of half each). */
    private readonly capacity: number,
  ) {}

  /**
   * Records that `fingerprint` arrived under `key` for `scope`, and returns the other key it
   * arrived under within the window, if any.
   */
  see(scope: string, fingerprint: string, key: string, now = performance.now()): string | undefined {
    const id = `${scope}\u0000${fingerprint}`;
    const earlier = this.current.get(id) ?? this.previous.get(id);
    if (earlier !== undefined && now - earlier.at <= this.windowMs) {
      // Same key: a retry as it should be. The entry keeps its first arrival, so a key that keeps
      // changing is still found within the window of the first copy.
      return earlier.key === key ? undefined : earlier.key;
    }
    if (this.current.size >= this.capacity / 2) {
      this.previous = this.current;
      this.current = new Map();
    }
    this.current.set(id, { key, at: now });
    return undefined;
  }
}
